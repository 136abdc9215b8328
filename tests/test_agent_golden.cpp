// agent-tiny, the tool-calling model that ../shared/models/train_agent.py trains, against the
// goldens the script computes with transformers (float32, eager, model.generate greedy): the chat
// template's rendering, the tokenizer, greedy ids of every golden conversation, the tool calls
// parsed out of them, and the teacher-forced NLL. Skipped where the model or its golden.json is
// absent (cmake -DPTLLM_AGENT_TINY=DIR points at one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "chat/chat_template.h"
#include "core/thread_pool.h"
#include "engine/chat_output.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;

class AgentTinyGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = PTLLM_AGENT_TINY_DIR;
    if (!fs::exists(dir_ / "model.safetensors") || !fs::exists(dir_ / "golden.json")) return;
    std::ifstream f(dir_ / "golden.json");
    golden_ = nlohmann::ordered_json::parse(f);  // the tools' keys in their order, as the template prints them
    model_ = Model::load(dir_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << dir_ << " has no model.safetensors and golden.json";
  }
  static inline fs::path dir_;
  static inline nlohmann::ordered_json golden_;
  static inline Model* model_ = nullptr;
};

TEST_F(AgentTinyGolden, TokenizerGivesTransformersIds) {
  const Tokenizer tok = Tokenizer::load(dir_);
  for (const auto& t : golden_["tokenizer"]) {
    const std::string text = t["text"];
    EXPECT_EQ(tok.encode(text, {.add_special = false}), t["ids"].get<std::vector<int32_t>>()) << text;
    const auto dflt = t["ids_default"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), dflt) << text;
    EXPECT_EQ(tok.decode(dflt, true), t["decoded_skip_special"].get<std::string>()) << text;
  }
}

TEST_F(AgentTinyGolden, TemplateRendersEveryConversationAsTransformers) {
  const chat::ChatTemplate tpl = chat::ChatTemplate::load(dir_.string());
  const Tokenizer tok = Tokenizer::load(dir_);
  for (const auto& c : golden_["cases"]) {
    chat::ChatRequest r;
    r.messages = chat::Json::parse(c["messages"].dump());
    if (!c["tools"].is_null()) r.tools = chat::Json::parse(c["tools"].dump());
    r.add_generation_prompt = true;
    const std::string prompt = tpl.render(r);
    EXPECT_EQ(prompt, c["prompt_text"].get<std::string>()) << c["id"];
    EXPECT_EQ(tok.encode(prompt, {.add_special = false}), c["prompt_ids"].get<std::vector<int32_t>>()) << c["id"];
  }
}

// Greedy decoding through the KV cache gives transformers' ids, and the reply's tool calls parse to
// the calls the script read out of the same text.
TEST_F(AgentTinyGolden, GreedyRepliesAndTheirToolCalls) {
  const Tokenizer tok = Tokenizer::load(dir_);
  const chat::ChatTemplate tpl = chat::ChatTemplate::load(dir_.string());
  const OutputFormat format = detect_output_format(tpl.source());
  EXPECT_EQ(format.tools, ToolCallFormat::Hermes);
  const auto eos = golden_["eos_token_ids"].get<std::vector<int32_t>>();
  const size_t max_new = golden_["max_new_tokens"].get<size_t>();
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 2048;
  int with_calls = 0;
  for (const auto& c : golden_["cases"]) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    Session s(*model_, o, pool);
    std::span<float> l = s.feed(prompt);
    std::vector<int32_t> got;
    while (got.size() < max_new) {
      got.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
      if (std::find(eos.begin(), eos.end(), got.back()) != eos.end()) break;
      l = s.feed({&got.back(), 1});
    }
    ASSERT_EQ(got, want) << c["id"];

    const nlohmann::ordered_json& tools = c["tools"];
    ChatOutputParser parser(chat_output_options(format, false, tools, true, c["prompt_text"].get<std::string>()));
    parser.push(tok.decode(got, true));
    parser.finish();
    const auto& calls = parser.calls();
    ASSERT_EQ(calls.size(), c["tool_calls"].size()) << c["id"] << ": " << c["greedy_text"];
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].name, c["tool_calls"][i]["name"].get<std::string>()) << c["id"];
      EXPECT_EQ(nlohmann::json::parse(calls[i].arguments), nlohmann::json::parse(c["tool_calls"][i]["arguments"].dump()))
          << c["id"];
    }
    if (calls.empty()) {
      EXPECT_EQ(parser.content(), c["content"].get<std::string>()) << c["id"];
    }
    with_calls += !calls.empty();
  }
  EXPECT_GT(with_calls, 0);
}

TEST_F(AgentTinyGolden, TeacherForcedNllAndArgmax) {
  const auto& tf = golden_["teacher_forced"];
  const auto ids = tf["ids"].get<std::vector<int32_t>>();
  const auto argmax = tf["argmax"].get<std::vector<int32_t>>();
  ThreadPool pool(2);
  SessionOptions o;
  o.kv.ctx_size = 2048;
  Session s(*model_, o, pool);
  const std::span<float> l = s.feed_all(ids);
  const int V = model_->config().vocab_size;
  const std::vector<double> nll = test::nll_of(l, ids, V);
  EXPECT_NEAR(test::mean(nll), tf["mean_nll"].get<double>(), 1e-3);
  size_t same = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const float* row = l.data() + t * size_t(V);
    same += int32_t(std::max_element(row, row + V) - row) == argmax[t];
  }
  EXPECT_EQ(same, ids.size());
}

}  // namespace
}  // namespace ptllm
