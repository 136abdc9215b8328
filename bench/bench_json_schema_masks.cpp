// Token-mask CPU time on grammars from JSON Schemas: median, p99 and max per mask over the decode
// steps of replies that follow the grammar (the corpus' valid instances and random sentences of
// the grammar, tokenized as a model would write them). Not a Google Benchmark: it reports a
// distribution per mask rather than a mean.
//
//   bench_json_schema_masks [TOKENIZER_PATH [SCHEMA_FILE...]]
// Defaults: ../shared/models/kjv-small and the corpus' tool schemas (tests/data/json_schemas/real).
#include <algorithm>
#include <time.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../tests/json_schema_check.h"
#include "engine/constraint.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

using namespace ptllm;
using namespace ptllm::grammar;

static double cpu_us() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

int main(int argc, char** argv) {
  const std::filesystem::path src = PTLLM_SOURCE_DIR;
  const std::filesystem::path tok_path = argc > 1 ? std::filesystem::path(argv[1]) : src / ".." / "shared" / "models" / "kjv-small";
  std::vector<std::filesystem::path> files;
  for (int i = 2; i < argc; ++i) files.emplace_back(argv[i]);
  if (files.empty())
    for (const char* f : {"tool_get_weather.json", "tool_web_search.json", "tool_create_calendar_event.json", "tool_run_sql.json",
                          "tool_book_flight.json", "tool_list_files.json"})
      files.push_back(src / "tests" / "data" / "json_schemas" / "real" / f);

  const Tokenizer tok = Tokenizer::load(tok_path);
  std::vector<std::string> vocab;
  std::vector<bool> special;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const int32_t ids[1] = {id};
    vocab.push_back(tok.decode(ids, false));
    special.push_back(tok.is_special(id));
  }
  const TokenTrie trie(vocab, special);
  std::printf("tokenizer %s: %zu tokens\n", tok_path.string().c_str(), vocab.size());
  // slow_same: of the masks above 1 ms, the share equal to the previous step's mask (inside one
  // string the matcher's state repeats, so a cache keyed by the state would serve them).
  std::printf("%-34s %6s %6s %9s %9s %9s %7s %9s %11s %11s\n", "schema", "texts", "masks", "median_us", "p99_us", "max_us", "stacks",
              "slow_same", "gen_med_us", "gen_p99_us");
  // gen_*: the generator's own mask (engine/constraint.h: masks cached by matcher state and kept
  // with the compiled grammar, EOS and special tokens, the logits written), over the same steps,
  // the texts of a schema one after the other as a server's requests arrive.
  const auto vocab_bytes = GrammarVocab::of(tok);
  const int32_t eos_ids[1] = {tok.eos_id().value_or(0)};
  std::vector<double> all_gen;

  std::vector<double> all;
  for (const auto& file : files) {
    std::ifstream in(file);
    const auto doc = nlohmann::ordered_json::parse(in);
    const std::string gbnf = json_schema_to_gbnf(doc["schema"]);
    const auto g = Grammar::parse(gbnf);
    auto spec = std::make_shared<ConstraintSpec>();
    spec->grammar = compile_grammar(gbnf);
    std::vector<double> gen_us;
    std::vector<float> logits(vocab_bytes->size());
    std::vector<std::string> texts;
    for (const auto& v : doc["valid"]) {
      texts.push_back(v.dump());
      texts.push_back(v.dump(2));
    }
    test::GrammarSampler sampler(g);
    std::mt19937 rng(7);
    for (int i = 0; i < 20; ++i) texts.push_back(sampler.sample(rng, 150));
    std::vector<double> us;
    size_t most_stacks = 0, slow = 0, slow_same = 0;
    for (const auto& text : texts) {
      EncodeOptions eo;
      eo.add_special = false;
      const auto ids = tok.encode(text, eo);
      GrammarMatcher m(g);
      Constraint c(spec, vocab_bytes);
      std::vector<bool> prev;
      for (int32_t id : ids) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        const double g0 = cpu_us();
        c.mask(logits, eos_ids);
        gen_us.push_back(cpu_us() - g0);
        c.accept(id);
        // Thread CPU time: the machine may be shared, and waiting for a core is not the mask's cost.
        const double t0 = cpu_us();
        const auto mask = trie.allowed(m);
        us.push_back(cpu_us() - t0);
        if (us.back() > 1000) {
          ++slow;
          slow_same += mask == prev ? 1 : 0;
        }
        prev = mask;
        if (!mask[static_cast<size_t>(id)] || !m.accept_string(vocab[static_cast<size_t>(id)])) {
          std::fprintf(stderr, "%s: token %d of %s not allowed\n", file.filename().c_str(), id, text.c_str());
          return 1;
        }
        most_stacks = std::max(most_stacks, m.stack_count());
      }
    }
    all.insert(all.end(), us.begin(), us.end());
    all_gen.insert(all_gen.end(), gen_us.begin(), gen_us.end());
    std::sort(us.begin(), us.end());
    std::sort(gen_us.begin(), gen_us.end());
    std::printf("%-34s %6zu %6zu %9.1f %9.1f %9.1f %7zu %4zu/%-4zu %11.1f %11.1f\n", file.filename().c_str(), texts.size(), us.size(),
                us[us.size() / 2], us[us.size() * 99 / 100], us.back(), most_stacks, slow_same, slow,
                gen_us[gen_us.size() / 2], gen_us[gen_us.size() * 99 / 100]);
  }
  std::sort(all.begin(), all.end());
  std::sort(all_gen.begin(), all_gen.end());
  std::printf("%-34s %6s %6zu %9.1f %9.1f %9.1f %7s %9s %11.1f %11.1f\n", "all", "", all.size(), all[all.size() / 2],
              all[all.size() * 99 / 100], all.back(), "", "", all_gen[all_gen.size() / 2], all_gen[all_gen.size() * 99 / 100]);
}
