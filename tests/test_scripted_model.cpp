// The scripted model (scripted_model.h) through the real binary: `posttrainllm sample` and `serve`
// write exactly the script, token by token, and stop at EOS; the builder refuses ambiguous scripts.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <vector>

#include "core/error.h"
#include "scripted_model.h"
#include "serve_process.h"
#include "test_util.h"

namespace ptllm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::ScriptedModelSpec;

const char kQwenTail[] = "<|im_start|>assistant\n";
const char kToolCall[] =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path template_file(const std::string& name) { return test::repo_dir() / "tests" / "data" / "chat_templates" / name; }

ScriptedModelSpec qwen_spec(std::vector<ScriptedModelSpec::Script> scripts) {
  ScriptedModelSpec s;
  s.scripts = std::move(scripts);
  s.prompt_tail = kQwenTail;
  s.chat_template = read_text(template_file("Qwen-Qwen2.5-7B-Instruct.jinja"));
  return s;
}

// A Qwen2.5 chat prompt as its template renders one user turn with a generation prompt.
std::string qwen_prompt(const std::string& user) {
  return "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `posttrainllm sample MODEL --prompt P --temperature 0 --json`: its JSON line.
json sample(const fs::path& model, const std::string& prompt, int tokens = 1000) {
  const auto r = test::run_command(test::binary() + " sample " + model.string() + " --prompt " + shell_quote(prompt) +
                                   " --temperature 0 --json -t 1 --tokens " + std::to_string(tokens));
  EXPECT_EQ(r.code, 0) << r.err;
  return json::parse(r.out, nullptr, false);
}

void expect_writes(const fs::path& model, const std::string& prompt, const std::string& text,
                   const std::vector<int32_t>& ids) {
  const json j = sample(model, prompt);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["text"], text);
  EXPECT_EQ(j["tokens"], json(ids));
  EXPECT_EQ(j["stop_reason"], "eos");
}

TEST(ScriptedModelTest, WritesAToolCallThenStopsAtEos) {
  test::TempDir dir;
  const auto info = test::write_scripted_model(qwen_spec({{kToolCall, "", ""}}), dir.path);
  ASSERT_EQ(info.script_ids.size(), 1u);
  ASSERT_GT(info.script_ids[0].size(), 30u);  // a real token-by-token script, not a few merged tokens
  // Whatever comes before the tail: only the tail decides.
  expect_writes(dir.path, qwen_prompt("What is the weather in Paris?"), kToolCall, info.script_ids[0]);
  expect_writes(dir.path, qwen_prompt("Tell me, in one word, how warm Paris is today and whether to take a coat."),
                kToolCall, info.script_ids[0]);
  // The emitted token's logit leads every other by about 30: sampling at temperature 1 writes the
  // script too.
  const auto r = test::run_command(test::binary() + " sample " + dir.path.string() + " --prompt " +
                                   shell_quote(qwen_prompt("Weather?")) +
                                   " --temperature 1 --top-k 0 --top-p 1 --seed 7 --json -t 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["text"], kToolCall);
  // The chat template travels in tokenizer_config.json; the model stays small.
  const json cfg = test::read_json(dir.path / "tokenizer_config.json");
  EXPECT_EQ(cfg["chat_template"], read_text(template_file("Qwen-Qwen2.5-7B-Instruct.jinja")));
  EXPECT_EQ(cfg["eos_token"], "</s>");
  const json config = test::read_json(dir.path / "config.json");
  EXPECT_EQ(config["num_hidden_layers"], 1);
  EXPECT_EQ(config["hidden_size"], info.hidden_size);
  EXPECT_LT(info.hidden_size, 4 * info.distinct_tokens + 64);
}

TEST(ScriptedModelTest, WritesALongScriptOfJsonAndProse) {
  const std::string text =
      "I will look up the forecast for each city you named, then compare them.\n"
      "<tool_call>\n{\"name\": \"get_forecast\", \"arguments\": {\"city\": \"Lyon\", \"days\": 3, \"units\": "
      "\"metric\"}}\n</tool_call>\n"
      "While that runs, here is what the data will hold: a list of daily entries, each with a high, a low, the "
      "chance of rain, and the wind speed in kilometres per hour.\n"
      "```json\n{\"city\": \"Lyon\", \"daily\": [{\"day\": 1, \"high\": 21.5, \"low\": 12.0, \"rain\": 0.1, "
      "\"wind\": 14}, {\"day\": 2, \"high\": 19.0, \"low\": 11.5, \"rain\": 0.6, \"wind\": 22}, {\"day\": 3, "
      "\"high\": 23.25, \"low\": 13.0, \"rain\": 0.0, \"wind\": 9}], \"source\": \"example\", \"ok\": true, "
      "\"notes\": null}\n```\n"
      "The second day looks wet: pack an umbrella. The third is the warmest, with a light wind from the "
      "south-west, and the evenings stay mild.\n"
      "En fran\xc3\xa7" "ais : il fera beau mercredi, mais prenez un parapluie mardi !\n"
      "Symbols and escapes: \xe2\x98\x80\xef\xb8\x8f \xf0\x9f\x8c\xa7\xef\xb8\x8f \xe2\x86\x92 23 \xc2\xb0" "C, a\ttab, "
      "\"quotes\" and a back\\slash; then [1, 2, 3] and {\"nested\": {\"deep\": [\"a\", \"b\"]}}.";
  test::TempDir dir;
  const auto info = test::write_scripted_model(qwen_spec({{text, "", ""}}), dir.path);
  ASSERT_GT(info.script_ids[0].size(), 300u);
  EXPECT_LT(info.distinct_tokens, 300);
  expect_writes(dir.path, qwen_prompt("Forecast for Lyon?"), text, info.script_ids[0]);
}

// A real model's width and depth around the script (ScriptedShape): the padded model writes the same
// script greedily through the real engine, with and without speculation, and its config has the
// shape asked for. Three layers of width 512 keep it small; the named shapes only fill these fields.
TEST(ScriptedModelTest, APaddedShapeWritesTheSameScript) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"London\"}}\n</tool_call>";
  test::TempDir plain, padded;
  const auto info0 = test::write_scripted_model(qwen_spec({{text, "", ""}}), plain.path);
  ScriptedModelSpec spec = qwen_spec({{text, "", ""}});
  // More query heads than the script's: groups of several, padding heads sharing the script's keys.
  spec.shape = {.layers = 3, .hidden = 512, .intermediate = 1024, .heads = 64, .kv_heads = 2};
  const auto info = test::write_scripted_model(spec, padded.path);
  ASSERT_LT(info0.hidden_size, 512);
  EXPECT_EQ(info.hidden_size, 512);
  EXPECT_EQ(info.script_hidden, info0.hidden_size);
  EXPECT_EQ(info.script_ids, info0.script_ids);
  const json config = test::read_json(padded.path / "config.json");
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["hidden_size"], 512);
  EXPECT_EQ(config["intermediate_size"], 1024);
  EXPECT_EQ(config["num_key_value_heads"], info.kv_heads);
  EXPECT_EQ(config["num_attention_heads"], info.heads);
  EXPECT_GE(info.kv_heads, 2);
  EXPECT_GT(info.heads, info.kv_heads);  // grouped: padding heads share the script heads' keys
  EXPECT_EQ(info.heads % info.kv_heads, 0);
  // The padded file holds the added layers' weights (BF16), not a few bytes of zeros.
  const auto bytes = fs::file_size(padded.path / "model.safetensors");
  EXPECT_GT(bytes, 2u * (2u * 512u * 1024u * 3u + 512u * 64u * 2u) * 2u);
  const std::string prompt = qwen_prompt("Weather in Paris and London?");
  expect_writes(padded.path, prompt, text, info.script_ids[0]);
  // Speculation verifies the drafts in passes of several rows: the same tokens.
  const auto r = test::run_command(test::binary() + " sample " + padded.path.string() + " --prompt " +
                                   shell_quote(prompt) + " --temperature 0 --json -t 2 --spec-type ngram --spec-fixed");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["tokens"], json(info.script_ids[0]));
  EXPECT_GT(j["speculative"]["accepted"].get<int>(), 0);
  // A width below the script's, or intermediate below its rules, is refused naming the size.
  spec.shape.hidden = info0.hidden_size - 1;
  test::TempDir bad;
  try {
    test::write_scripted_model(spec, bad.path);
    ADD_FAILURE() << "a narrow hidden size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden size"), std::string::npos) << e.what();
  }
  spec.shape.hidden = 512;
  spec.shape.intermediate = 1;
  EXPECT_THROW(test::write_scripted_model(spec, bad.path), Error);
  EXPECT_THROW(test::scripted_shape("llama-9"), Error);
  EXPECT_EQ(test::scripted_shape("llama-3.2-1b").hidden, 2048);
}

TEST(ScriptedModelTest, WritesParallelCallsOfTheSameFunction) {
  // The second call differs from the first only in its argument, 30 tokens in: the rules there
  // look back past the first call's end.
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"London\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call>";
  test::TempDir dir;
  const auto info = test::write_scripted_model(qwen_spec({{text, "", ""}}), dir.path);
  EXPECT_GT(info.context, 30);
  expect_writes(dir.path, qwen_prompt("Weather in Paris and London, and the time in Tokyo?"), text,
                info.script_ids[0]);
}

// The copy heads' margins survive a KV cache of 8 bits or more: each writes the same script (the
// second call's rules look 30 tokens back, into the quantized part of KIVI's cache). int2's four
// levels a channel blur the RoPE phases the copy heads compare, and the script breaks.
TEST(ScriptedModelTest, KvCachesOfEightBitsOrMoreWriteTheScript) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"London\"}}\n</tool_call>";
  test::TempDir dir;
  test::write_scripted_model(qwen_spec({{text, "", ""}}), dir.path);
  for (const char* kv : {"fp16", "bf16", "int8"}) {
    const auto r = test::run_command(test::binary() + " sample " + dir.path.string() + " --prompt " +
                                     shell_quote(qwen_prompt("Weather in Paris and London?")) +
                                     " --temperature 0 --json -t 1 --kv-group-size 16 --kv-residual 16 --kv-quantize " + kv);
    ASSERT_EQ(r.code, 0) << kv << ": " << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["text"], text) << kv;
    EXPECT_EQ(j["stop_reason"], "eos") << kv;
  }
}

// An agent's two turns: the tool call, then, with the tool's result in the prompt, the answer.
TEST(ScriptedModelTest, ATriggerInThePromptSelectsTheSecondScript) {
  const std::string answer = "It is sunny in Paris, 18 degrees: no coat needed.";
  test::TempDir dir;
  // " sun" is one token of this tokenizer, and only the tool's result has it.
  const auto info = test::write_scripted_model(qwen_spec({{kToolCall, "", ""}, {answer, " sun", ""}}), dir.path);
  const std::string turn1 = qwen_prompt("What is the weather in Paris?");
  expect_writes(dir.path, turn1, kToolCall, info.script_ids[0]);
  const std::string turn2 = turn1 + kToolCall +
                            "<|im_end|>\n<|im_start|>user\n<tool_response>\n{\"sky\": \"clear\", \"note\": \"full "
                            "sun\", \"celsius\": 18}\n</tool_response><|im_end|>\n" + kQwenTail;
  expect_writes(dir.path, turn2, answer, info.script_ids[1]);
}

// Scripts with tails of their own: a chat turn and a plain completion prompt in one model.
TEST(ScriptedModelTest, EachScriptMayHaveItsOwnTail) {
  test::TempDir dir;
  const std::string capital = " Paris, on the Seine.";
  const auto info = test::write_scripted_model(
      qwen_spec({{kToolCall, "", ""}, {capital, "", "Q: What is the capital of France?\nA:"}}), dir.path);
  expect_writes(dir.path, qwen_prompt("Weather?"), kToolCall, info.script_ids[0]);
  expect_writes(dir.path, "Geography quiz.\nQ: What is the capital of France?\nA:", capital, info.script_ids[1]);
}

// Three turns: each tool's result brings its trigger, and the latest trigger selects the script.
TEST(ScriptedModelTest, TheLatestTriggerSelectsTheScript) {
  const std::string call2 = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const std::string answer = "Full sun and warm in Paris, and it is noon.";
  test::TempDir dir;
  const auto info = test::write_scripted_model(
      qwen_spec({{kToolCall, "", ""}, {call2, " sun", ""}, {answer, " warm", ""}}), dir.path);
  auto result = [](const std::string& text) {
    return "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + text + "\n</tool_response><|im_end|>\n" + kQwenTail;
  };
  const std::string turn1 = qwen_prompt("What is the weather in Paris, and the time?");
  const std::string turn2 = turn1 + kToolCall + result("{\"sky\": \"full sun\"}");
  const std::string turn3 = turn2 + call2 + result("{\"time\": \"noon\", \"feel\": \"a warm day\"}");
  expect_writes(dir.path, turn1, kToolCall, info.script_ids[0]);
  expect_writes(dir.path, turn2, call2, info.script_ids[1]);
  expect_writes(dir.path, turn3, answer, info.script_ids[2]);
}

TEST(ScriptedModelTest, AmbiguousScriptsAreRefused) {
  test::TempDir dir;
  auto message = [&](const ScriptedModelSpec& spec) {
    try {
      test::write_scripted_model(spec, dir.path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error";
    return std::string();
  };
  // Two scripts after the same tail, with nothing to tell them apart.
  std::string m = message(qwen_spec({{"Hello there.", "", ""}, {"Goodbye.", "", ""}}));
  EXPECT_NE(m.find("ambiguous"), std::string::npos) << m;
  EXPECT_NE(m.find("script 1 writes \"H"), std::string::npos) << m;
  EXPECT_NE(m.find("script 2 writes \"Good"), std::string::npos) << m;
  EXPECT_NE(m.find("all that the prompt tail leaves"), std::string::npos) << m;
  // Three tokens of context cannot tell <tool_call>'s "call>" from </tool_call>'s.
  ScriptedModelSpec short_context = qwen_spec({{kToolCall, "", ""}});
  short_context.context_tokens = 3;
  m = message(short_context);
  EXPECT_NE(m.find("after \"call>\" (the last 3 token(s))"), std::string::npos) << m;
  EXPECT_NE(m.find("script 1 writes \"\\n\" but script 1 itself writes EOS"), std::string::npos) << m;
  // Nothing was written.
  EXPECT_FALSE(fs::exists(dir.path / "config.json"));
}

TEST(ScriptedModelTest, BadTriggersAndTailsAreRefused) {
  test::TempDir dir;
  EXPECT_THROW(
      {
        try {
          test::write_scripted_model(qwen_spec({{kToolCall, "", ""}, {"Sunny.", "<tool_response>", ""}}), dir.path);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("encodes to"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("\"<\""), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  // The plain script writes the later script's trigger: its own turn would switch to the other.
  EXPECT_THROW(test::write_scripted_model(qwen_spec({{"The sun is out.", "", ""}, {"Warm.", " sun", ""}}), dir.path),
               Error);
  ScriptedModelSpec one_token_tail = qwen_spec({{kToolCall, "", ""}});
  one_token_tail.prompt_tail = "\n";
  EXPECT_THROW(test::write_scripted_model(one_token_tail, dir.path), Error);
}

// The command the Node.js tests use, then the model through `serve`: /v1/completions and, with
// the template the model carries, /v1/chat/completions.
TEST(ScriptedModelTest, TheCommandWritesAModelThatServeRuns) {
  test::TempDir dir;
  const fs::path model = dir.path / "model";
  const std::string answer = "It is sunny in Paris.";
  const auto r = test::run_command(std::string(PTLLM_SCRIPTED_MODEL_BINARY) + " " + model.string() +
                                   " --template " + template_file("Qwen-Qwen2.5-7B-Instruct.jinja").string() +
                                   " --prompt-tail " + shell_quote(kQwenTail) + " --script " + shell_quote(kToolCall) +
                                   " --script-after ' sun' " + shell_quote(answer));
  ASSERT_EQ(r.code, 0) << r.err;
  const json info = json::parse(r.out);
  ASSERT_EQ(info["script_ids"].size(), 2u);

  test::ServeProcess server(model, {}, dir.path / "serve.err");
  ASSERT_GT(server.port, 0) << server.log();
  const std::string turn1 = qwen_prompt("What is the weather in Paris?");
  json reply = server.post_ok("/v1/completions", {{"prompt", turn1}, {"max_tokens", 200}, {"temperature", 0}});
  EXPECT_EQ(reply["choices"][0]["text"], kToolCall);
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(reply["usage"]["completion_tokens"], info["script_ids"][0].size() + 1);  // EOS counts

  const json user = {{"role", "user"}, {"content", "What is the weather in Paris?"}};
  reply = server.post_ok("/v1/chat/completions",
                         {{"messages", {user}}, {"max_tokens", 200}, {"temperature", 0}});
  EXPECT_EQ(reply["choices"][0]["message"]["content"], kToolCall);
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop");
  const json call = {{"role", "assistant"},
                     {"content", ""},
                     {"tool_calls",
                      {{{"id", "call_1"},
                        {"type", "function"},
                        {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}};
  const json result = {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"sky\": \"full sun\"}"}};
  reply = server.post_ok("/v1/chat/completions",
                         {{"messages", {user, call, result}}, {"max_tokens", 200}, {"temperature", 0}});
  EXPECT_EQ(reply["choices"][0]["message"]["content"], answer);
  // Both turns at once, decoded in one batch (-np 2), still write their scripts.
  auto turn = [&](const json& messages) {
    return std::async(std::launch::async, [&server, messages] {
      return server.post_ok("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 200}, {"temperature", 0}});
    });
  };
  for (int i = 0; i < 3; ++i) {
    auto a = turn(json::array({user})), b = turn(json::array({user, call, result}));
    EXPECT_EQ(a.get()["choices"][0]["message"]["content"], kToolCall);
    EXPECT_EQ(b.get()["choices"][0]["message"]["content"], answer);
  }
  EXPECT_EQ(server.stop(), 0);

  // Usage errors exit 2, refused scripts 1.
  EXPECT_EQ(test::run_command(std::string(PTLLM_SCRIPTED_MODEL_BINARY) + " " + model.string() + " --script x").code, 2);
  const auto bad = test::run_command(std::string(PTLLM_SCRIPTED_MODEL_BINARY) + " " + model.string() +
                                     " --prompt-tail " + shell_quote(kQwenTail) + " --script Hello --script Bye");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("ambiguous"), std::string::npos) << bad.err;
}

// Other templates' generation prompts as tails, each model writing its template's own tool-call
// syntax: the server renders the template with the request's tools and parses the call back.
TEST(ScriptedModelTest, ServeParsesTheCallOfEachTemplate) {
  const char* hermes = kToolCall;
  const struct {
    const char* name;
    const char* tail;
    const char* call;
  } cases[] = {
      {"Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_start|>assistant\n", hermes},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "<|im_start|>assistant\n", hermes},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", "<|start_header_id|>assistant<|end_header_id|>\n\n",
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"},
      {"mistralai-Mistral-7B-Instruct-v0.3.jinja", "[/INST]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"},
      // Templates that show no call syntax get the Hermes one.
      {"google-gemma-2-2b-it.jinja", "<start_of_turn>model\n", hermes},
      {"microsoft-Phi-3.5-mini-instruct.jinja", "<|assistant|>\n", hermes},
  };
  const json tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "The weather in a city"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}, {"required", {"city"}}}}}}};
  const json messages = json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    test::TempDir dir;
    ScriptedModelSpec spec;
    spec.scripts = {{c.call, "", ""}};
    spec.prompt_tail = c.tail;
    spec.chat_template = read_text(template_file(c.name));
    test::write_scripted_model(spec, dir.path / "model");
    test::ServeProcess server(dir.path / "model", {}, dir.path / "serve.err");
    ASSERT_GT(server.port, 0) << server.log();
    json reply = server.post_ok("/v1/chat/completions", {{"messages", messages},
                                                         {"tools", json::array({tool})},
                                                         {"max_tokens", 200},
                                                         {"temperature", 0}});
    const json& calls = reply["choices"][0]["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 1u) << reply.dump();
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
    EXPECT_EQ(reply["choices"][0]["finish_reason"], "tool_calls");
    // Without tools the same reply is plain content, exactly the script (Hermes-3's tool_use
    // template renders only requests with tools).
    if (std::string(c.name).find("tool_use") == std::string::npos) {
      reply = server.post_ok("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 200}, {"temperature", 0}});
      EXPECT_EQ(reply["choices"][0]["message"]["content"], c.call);
      EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop");
    }
    EXPECT_EQ(server.stop(), 0);
  }
}

}  // namespace
}  // namespace ptllm
