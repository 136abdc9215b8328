// ptllm_scripted_model: writes a scripted model (scripted_model.h) for tests outside C++, such as
// the Node.js client tests. Prints what it built as one JSON line on stdout.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "scripted_model.h"

namespace {

const char kUsage[] =
    "usage: ptllm_scripted_model OUT_DIR --prompt-tail TEXT (--script TEXT | --script-after TRIGGER TEXT)...\n"
    "                            [--template FILE] [--context N] [--max-position N] [--tokenizer DIR]\n"
    "                            [--shape kjv-small|llama-3.2-1b] [--layers N] [--hidden N] [--intermediate N]\n"
    "                            [--heads N --kv-heads N]\n"
    "  --script TEXT                what the model writes, then EOS, when no trigger token is in the prompt\n"
    "  --script-after TRIGGER TEXT  what it writes when TRIGGER (one token) is in the prompt and no later\n"
    "                               script's trigger is\n"
    "  --prompt-tail TEXT           the text every prompt ends with (e.g. \"<|im_start|>assistant\\n\")\n"
    "  --template FILE              the chat template put into tokenizer_config.json\n"
    "  --context N                  the most tokens a rule may look at (default 64)\n"
    "  --max-position N             max_position_embeddings (default 4096)\n"
    "  --tokenizer DIR              where tokenizer.json comes from (default: models/kjv-tiny)\n"
    "  --shape NAME                 the width and depth of a real model around the script: the script's\n"
    "                               layer widened, further layers of random weights that add exactly zero\n"
    "                               to the residual (scripted_model.h); --layers etc. after it override\n"
    "  --layers N, --hidden N, --intermediate N, --heads N, --kv-heads N   the same, one by one\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "ptllm_scripted_model: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

int positive(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 1 || n > 1 << 20) usage(flag + " needs a positive integer, got '" + v + "'");
  return int(n);
}

}  // namespace

int main(int argc, char** argv) {
  using ptllm::test::ScriptedModelSpec;
  ScriptedModelSpec spec;
  std::string out_dir;
  bool tail_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int k = 1) -> std::string {
      if (i + k >= argc) usage(a + " needs " + std::to_string(k) + " value(s)");
      return argv[i + k];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--script") {
      spec.scripts.push_back({value(), "", ""});
      i += 1;
    } else if (a == "--script-after") {
      spec.scripts.push_back({value(2), value(1), ""});
      i += 2;
    } else if (a == "--prompt-tail") {
      spec.prompt_tail = value();
      tail_given = true;
      i += 1;
    } else if (a == "--template") {
      std::ifstream in(value(), std::ios::binary);
      if (!in) usage("cannot read the template " + value());
      std::stringstream ss;
      ss << in.rdbuf();
      spec.chat_template = ss.str();
      i += 1;
    } else if (a == "--context") {
      spec.context_tokens = positive(a, value());
      i += 1;
    } else if (a == "--max-position") {
      spec.max_position = positive(a, value());
      i += 1;
    } else if (a == "--shape") {
      try {
        spec.shape = ptllm::test::scripted_shape(value());
      } catch (const ptllm::Error& e) {
        usage(e.what());
      }
      i += 1;
    } else if (int* dim = a == "--layers"         ? &spec.shape.layers
                          : a == "--hidden"       ? &spec.shape.hidden
                          : a == "--intermediate" ? &spec.shape.intermediate
                          : a == "--heads"        ? &spec.shape.heads
                          : a == "--kv-heads"     ? &spec.shape.kv_heads
                                                  : nullptr) {
      *dim = positive(a, value());
      i += 1;
    } else if (a == "--tokenizer") {
      spec.tokenizer_dir = value();
      i += 1;
    } else if (a.rfind("--", 0) == 0) {
      usage("unknown option " + a);
    } else if (out_dir.empty()) {
      out_dir = a;
    } else {
      usage("one OUT_DIR only");
    }
  }
  if (out_dir.empty()) usage("OUT_DIR is missing");
  if (!tail_given) usage("--prompt-tail is missing");
  if (spec.scripts.empty()) usage("no --script or --script-after");
  try {
    const auto info = ptllm::test::write_scripted_model(spec, out_dir);
    const nlohmann::json j = {{"model", out_dir},
                              {"script_ids", info.script_ids},
                              {"distinct_tokens", info.distinct_tokens},
                              {"hidden_size", info.hidden_size},
                              {"rules", info.rules},
                              {"context", info.context},
                              {"script_hidden", info.script_hidden},
                              {"layers", info.layers},
                              {"heads", info.heads},
                              {"kv_heads", info.kv_heads},
                              {"head_dim", info.head_dim},
                              {"intermediate", info.intermediate}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const ptllm::Error& e) {
    std::fprintf(stderr, "ptllm_scripted_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
