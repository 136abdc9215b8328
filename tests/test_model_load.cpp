// Model loading: config.json spellings, safetensors checks, shards, and the malformed-file cases,
// each with the message a user sees.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/session.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using test::RawTensor;

// Copies kjv-tiny's config.json into dir and writes model.safetensors from `tensors`.
void make_model(const fs::path& dir, const std::vector<RawTensor>& tensors) {
  fs::copy_file(test::repo_model("kjv-tiny") / "config.json", dir / "config.json");
  test::write_safetensors(dir / "model.safetensors", tensors);
}

std::string load_error(const fs::path& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelLoadTest, ReadsBothConfigSpellings) {
  ModelConfig v4 = ModelConfig::load(test::repo_model("llama-mha-ropescaled-tiny") / "config.json");
  EXPECT_EQ(v4.rope.type, RopeType::Llama3);
  EXPECT_DOUBLE_EQ(v4.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(v4.rope.factor, 8.0);
  EXPECT_EQ(v4.rope.original_max_position, 256);
  EXPECT_FLOAT_EQ(v4.rms_norm_eps, 1e-6f);
  EXPECT_EQ(v4.n_kv_heads, 4);
  EXPECT_FALSE(v4.tie_word_embeddings);
  EXPECT_EQ(v4.dtype, "bfloat16");

  ModelConfig v5 = ModelConfig::load(test::repo_model("mistral-tiny") / "config.json");
  EXPECT_EQ(v5.arch, Architecture::Mistral);
  EXPECT_EQ(v5.rope.type, RopeType::Default);
  EXPECT_DOUBLE_EQ(v5.rope.theta, 10000.0);
  EXPECT_EQ(v5.n_kv_heads, 1);
  EXPECT_EQ(v5.dtype, "float16");

  ModelConfig qwen = ModelConfig::load(test::repo_model("qwen2-tiny") / "config.json");
  EXPECT_EQ(qwen.arch, Architecture::Qwen2);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_EQ(qwen.head_dim, 32);  // derived: hidden 128 / 4 heads
  EXPECT_EQ(qwen.eos_token_ids, std::vector<int>{1});
}

TEST(ModelLoadTest, ConfigErrorsNameTheField) {
  auto base = test::read_json(test::repo_model("kjv-tiny") / "config.json");
  auto err = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = base;
    edit(j);
    try {
      ModelConfig::from_json(j, "config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(err([](auto& j) { j["architectures"] = {"GPT2LMHeadModel"}; }).find("architecture 'GPT2LMHeadModel' is not supported"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) { j.erase("hidden_size"); }).find("'hidden_size' is missing"), std::string::npos);
  EXPECT_NE(err([](auto& j) { j["num_key_value_heads"] = 3; }).find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(err([](auto& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }).find("'yarn' is not supported"),
            std::string::npos);
  EXPECT_NE(err([](auto& j) { j["vocab_size"] = -5; }).find("'vocab_size' must be a positive integer"), std::string::npos);
  EXPECT_EQ(err([](auto&) {}), "(no error)");
}

// Per-layer attention kinds as transformers resolves them (config.cpp, parse_attention_kinds).
TEST(ModelLoadTest, SlidingWindowsFromConfig) {
  using K = AttentionKind;
  const std::vector<K> full(3, K::Full), sliding(3, K::Sliding);
  ModelConfig swa = ModelConfig::load(test::repo_dir() / "tests/data/mistral-swa-tiny/config.json");
  EXPECT_EQ(swa.layer_kinds, sliding);
  EXPECT_EQ(swa.sliding_window, 64);
  EXPECT_EQ(swa.layer_windows(), std::vector<int>(3, 64));
  for (const char* m : {"mistral-tiny", "qwen2-tiny", "kjv-tiny"}) {  // sliding_window null, or no window at all
    ModelConfig c = ModelConfig::load(test::repo_model(m) / "config.json");
    EXPECT_EQ(c.layer_windows(), std::vector<int>(size_t(c.n_layers), 0)) << m;
    EXPECT_EQ(c.sliding_window, 0) << m;
  }

  auto mistral = test::read_json(test::repo_model("mistral-tiny") / "config.json");
  auto qwen = test::read_json(test::repo_model("qwen2-tiny") / "config.json");
  auto llama = test::read_json(test::repo_model("kjv-tiny") / "config.json");
  auto windows = [](nlohmann::json j, const std::function<void(nlohmann::json&)>& edit) {
    edit(j);
    return ModelConfig::from_json(j, "config.json").layer_windows();
  };
  const std::vector<int> none(3, 0);
  // Mistral: every layer, whatever layer_types says (MistralModel ignores it); absent: 4096.
  EXPECT_EQ(windows(mistral, [](auto& j) { j["sliding_window"] = 16; }), std::vector<int>(3, 16));
  EXPECT_EQ(windows(mistral, [](auto& j) { j.erase("sliding_window"); }), std::vector<int>(3, 4096));
  EXPECT_EQ(windows(mistral, [](auto& j) {
              j["sliding_window"] = 16;
              j["layer_types"] = {"full_attention", "full_attention", "full_attention"};
            }),
            std::vector<int>(3, 16));
  // Qwen2: only with use_sliding_window; layers >= max_window_layers (default 28) slide; layer_types wins.
  EXPECT_EQ(windows(qwen, [](auto& j) { j["sliding_window"] = 16; }), none);  // use_sliding_window false
  auto qwen_swa = [&](const std::function<void(nlohmann::json&)>& edit) {
    return windows(qwen, [&](auto& j) {
      j["use_sliding_window"] = true;
      j["sliding_window"] = 16;
      j.erase("layer_types");
      edit(j);
    });
  };
  EXPECT_EQ(qwen_swa([](auto& j) { j["max_window_layers"] = 1; }), (std::vector<int>{0, 16, 16}));
  EXPECT_EQ(qwen_swa([](auto& j) { j["max_window_layers"] = 0; }), std::vector<int>(3, 16));
  EXPECT_EQ(qwen_swa([](auto& j) { j["max_window_layers"] = 3; }), none);
  EXPECT_EQ(qwen_swa([](auto& j) { j.erase("max_window_layers"); }), none);  // 28 >= 3 layers
  EXPECT_EQ(qwen_swa([](auto& j) { j["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"}; }),
            (std::vector<int>{16, 0, 16}));
  EXPECT_EQ(qwen_swa([](auto& j) { j["sliding_window"] = nullptr; }), none);
  EXPECT_EQ(qwen_swa([](auto& j) {
              j.erase("sliding_window");
              j["max_window_layers"] = 2;
            }),
            (std::vector<int>{0, 0, 4096}));
  // Llama has no sliding attention (LlamaAttention ignores both keys).
  EXPECT_EQ(windows(llama, [](auto& j) {
              j["sliding_window"] = 16;
              j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"};
            }),
            std::vector<int>(4, 0));
}

TEST(ModelLoadTest, SlidingWindowErrorsNameTheField) {
  auto mistral = test::read_json(test::repo_model("mistral-tiny") / "config.json");
  auto qwen = test::read_json(test::repo_model("qwen2-tiny") / "config.json");
  qwen["use_sliding_window"] = true;
  qwen["sliding_window"] = 16;
  auto err = [](nlohmann::json j, const std::function<void(nlohmann::json&)>& edit) {
    edit(j);
    try {
      ModelConfig::from_json(j, "x/config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
  };
  EXPECT_TRUE(has(err(mistral, [](auto& j) { j["sliding_window"] = 0; }),
                  "x/config.json: field 'sliding_window' must be a positive integer, got 0"));
  EXPECT_TRUE(has(err(mistral, [](auto& j) { j["sliding_window"] = -64; }), "'sliding_window' must be a positive integer, got -64"));
  EXPECT_TRUE(has(err(mistral, [](auto& j) { j["sliding_window"] = "64"; }), "'sliding_window' must be a positive integer"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["sliding_window"] = 0; }), "'sliding_window' must be a positive integer"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["layer_types"] = {"full_attention", "sliding_attention"}; }),
                  "x/config.json: field 'layer_types' has 2 entries, num_hidden_layers is 3"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["layer_types"] = {"full_attention", "chunked_attention", "full_attention"}; }),
                  "field 'layer_types[1]' \"chunked_attention\" is not supported (supported: full_attention, sliding_attention)"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["layer_types"] = {"full_attention", 7, "full_attention"}; }), "'layer_types[1]' 7 is not supported"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["layer_types"] = "sliding_attention"; }), "field 'layer_types' must be a list"));
  // layer_types is checked even where transformers does not read it.
  EXPECT_TRUE(has(err(mistral, [](auto& j) { j["layer_types"] = {"full_attention"}; }), "'layer_types' has 1 entries"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j.erase("layer_types"); j["max_window_layers"] = -1; }),
                  "field 'max_window_layers' must be a non-negative integer, got -1"));
  EXPECT_TRUE(has(err(qwen, [](auto& j) { j["use_sliding_window"] = "yes"; }), "field 'use_sliding_window' must be true or false"));
  EXPECT_EQ(err(qwen, [](auto&) {}), "(no error)");
  EXPECT_EQ(err(mistral, [](auto&) {}), "(no error)");
}

TEST(ModelLoadTest, UnknownArchitectureIsAnError) {
  test::TempDir tmp;
  auto j = test::read_json(test::repo_model("kjv-tiny") / "config.json");
  j["architectures"] = {"FalconForCausalLM"};
  std::ofstream(tmp.path / "config.json") << j.dump();
  EXPECT_NE(load_error(tmp.path).find("config.json: architecture 'FalconForCausalLM' is not supported"), std::string::npos);
}

TEST(ModelLoadTest, MissingTensorIsNamed) {
  test::TempDir tmp;
  auto tensors = test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors");
  std::erase_if(tensors, [](const RawTensor& t) { return t.name == "model.layers.2.mlp.up_proj.weight"; });
  make_model(tmp.path, tensors);
  EXPECT_NE(load_error(tmp.path).find("tensor 'model.layers.2.mlp.up_proj.weight' is missing"), std::string::npos);
}

TEST(ModelLoadTest, MisshapenTensorIsNamed) {
  test::TempDir tmp;
  auto tensors = test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors");
  for (auto& t : tensors)
    if (t.name == "model.layers.1.self_attn.k_proj.weight") {
      t.shape = {32, 128};
      t.bytes.resize(32 * 128 * 4);
    }
  make_model(tmp.path, tensors);
  EXPECT_NE(load_error(tmp.path).find("tensor 'model.layers.1.self_attn.k_proj.weight' has shape [32, 128], config.json implies [64, 128]"),
            std::string::npos)
      << load_error(tmp.path);
}

TEST(ModelLoadTest, TruncatedFileIsDetected) {
  test::TempDir tmp;
  fs::copy_file(test::repo_model("kjv-tiny") / "config.json", tmp.path / "config.json");
  fs::copy_file(test::repo_model("kjv-tiny") / "model.safetensors", tmp.path / "model.safetensors");
  fs::resize_file(tmp.path / "model.safetensors", fs::file_size(tmp.path / "model.safetensors") - 1000);
  std::string e = load_error(tmp.path);
  EXPECT_NE(e.find("model.safetensors: tensor '"), std::string::npos) << e;
  EXPECT_NE(e.find("run past the end of the file"), std::string::npos) << e;

  fs::resize_file(tmp.path / "model.safetensors", 5);
  EXPECT_NE(load_error(tmp.path).find("truncated (5 bytes"), std::string::npos);
}

TEST(ModelLoadTest, HeaderThatLiesIsDetected) {
  test::TempDir tmp;
  const fs::path f = tmp.path / "x.safetensors";
  auto load = [&]() -> std::string {
    try {
      SafetensorsFile s(f);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  RawTensor t{"w", "F32", {4, 4}, std::string(64, '\0')};
  // dtype x shape needs 64 bytes but the range says 32
  test::write_safetensors(f, {t}, R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,32]}})");
  EXPECT_NE(load().find("tensor 'w': byte range holds 32 bytes but F32 [4, 4] needs 64"), std::string::npos) << load();
  // header length larger than the file
  {
    std::ofstream out(f, std::ios::binary);
    uint64_t n = 1 << 20;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(load().find("header length 1048576 exceeds the file size"), std::string::npos) << load();
  test::write_safetensors(f, {t}, R"({"w":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]},"v":{"dtype":"F32","shape":[4],"data_offsets":[48,64]}})");
  EXPECT_NE(load().find("overlap"), std::string::npos) << load();
  test::write_safetensors(f, {t}, R"({"w":{"dtype":"Q4_K","shape":[4,4],"data_offsets":[0,64]}})");
  EXPECT_NE(load().find("tensor 'w': unsupported dtype \"Q4_K\""), std::string::npos) << load();
  test::write_safetensors(f, {t}, R"({"w": not json)");
  EXPECT_NE(load().find("header is not a valid JSON object"), std::string::npos) << load();
  test::write_safetensors(f, {t});
  EXPECT_EQ(load(), "(no error)");
}

TEST(ModelLoadTest, MissingDirectoryAndWeights) {
  EXPECT_NE(load_error("/nonexistent/model").find("/nonexistent/model: not a model directory"), std::string::npos);
  test::TempDir tmp;
  fs::copy_file(test::repo_model("kjv-tiny") / "config.json", tmp.path / "config.json");
  EXPECT_NE(load_error(tmp.path).find("no model.safetensors or model.safetensors.index.json"), std::string::npos);
}

// A model split into two shards with an index loads and computes the same logits.
TEST(ModelLoadTest, ShardedCheckpointMatchesSingleFile) {
  test::TempDir tmp;
  auto tensors = test::read_raw(test::repo_model("kjv-tiny") / "model.safetensors");
  std::vector<RawTensor> a(tensors.begin(), tensors.begin() + std::ptrdiff_t(tensors.size() / 2));
  std::vector<RawTensor> b(tensors.begin() + std::ptrdiff_t(tensors.size() / 2), tensors.end());
  fs::copy_file(test::repo_model("kjv-tiny") / "config.json", tmp.path / "config.json");
  test::write_safetensors(tmp.path / "model-00001-of-00002.safetensors", a);
  test::write_safetensors(tmp.path / "model-00002-of-00002.safetensors", b);
  nlohmann::json index;
  for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(tmp.path / "model.safetensors.index.json") << index.dump();

  auto single = Model::load(test::repo_model("kjv-tiny"));
  auto sharded = Model::load(tmp.path);
  EXPECT_EQ(sharded->files().files().size(), 2u);
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 64;
  Session s1(*single, o, pool), s2(*sharded, o, pool);
  std::vector<int32_t> ids = {0, 613, 265, 3896};
  auto l1 = s1.feed(ids);
  auto l2 = s2.feed(ids);
  ASSERT_EQ(l1.size(), l2.size());
  for (size_t i = 0; i < l1.size(); ++i) ASSERT_EQ(l1[i], l2[i]);
}

// A header not padded to 8 bytes leaves tensor data misaligned: still loaded, same logits.
TEST(ModelLoadTest, MisalignedTensorDataLoads) {
  test::TempDir tmp;
  auto tensors = test::read_raw(test::repo_model("mistral-tiny") / "model.safetensors");  // f16
  nlohmann::json h;
  size_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = h.dump();
  if (header.size() % 2 == 0) header += ' ';  // odd length: every tensor starts at an odd address
  fs::copy_file(test::repo_model("mistral-tiny") / "config.json", tmp.path / "config.json");
  test::write_safetensors(tmp.path / "model.safetensors", tensors, header);
  auto a = Model::load(test::repo_model("mistral-tiny"));
  auto b = Model::load(tmp.path);
  ThreadPool pool(1);
  SessionOptions o;
  o.kv.ctx_size = 16;
  Session sa(*a, o, pool), sb(*b, o, pool);
  std::vector<int32_t> ids = {0, 613, 265};
  auto la = sa.feed(ids);
  auto lb = sb.feed(ids);
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]);
}

TEST(ModelLoadTest, HalfPrecisionConversionIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "half bits " << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0);        // ties to even: rounds down to 0
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002); // 1.5 units rounds to 2
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);  // ties to even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
}

}  // namespace
}  // namespace ptllm
