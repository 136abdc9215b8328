#pragma once
// A test fixture: a one-layer Llama checkpoint whose weights are constructed, not trained, so that
// greedy decoding after a given prompt tail writes a given text token by token, then EOS. Tool-call
// tests run it through the real engine, server and clients and know exactly what it will say.
//
// How it works (each choice is checked numerically by the builder, which refuses what it cannot
// make exact):
// - The residual stream holds one-hot codes: slot 0 the current token over S, the distinct tokens
//   of the scripts, tails and triggers (any other token has the code "other"); slot d (1..K-1) the
//   token d back, over the tokens some rule looks for there; then a constant dimension, one flag
//   per trigger, and an output slot over the tokens the scripts emit (EOS included). Every
//   embedding has the same norm, so the first RMSNorm is a fixed scale its weights undo.
// - Head d copies slot 0 of the token d back: its query and key read only the constant dimension
//   and differ by a RoPE rotation of d positions, so its score depends on the distance alone and
//   peaks at d (sum over frequency pairs of cos((m - n - d) * theta_i)).
// - A flag head attends to its trigger token anywhere in the context (its only nonzero key), on
//   RoPE's slowest pair, whose angle stays small over the whole context.
// - The SiLU-gated MLP has one unit per rule "these last n tokens (and these flags) -> this next
//   token": the gate is a threshold on the number of matched conditions, down_proj writes the next
//   token's output dimension, and the untied lm_head maps the output slot to the vocabulary.
//   Each rule uses the fewest last tokens (at most K) whose continuation is unique among all the
//   scripts of its group, so every rule that fires at a script position names the same token.
// Scripts after a trigger: a script with trigger T runs when T's token is in the context and no
// later-declared trigger's token is; a script without one when no trigger token is (turn k of an
// agent loop: the tool results so far are in the prompt, the latest one selects the script).
// The emitted token's logit leads every other by about 30, so sampling writes the script too.
// Limits: only the tail and the triggers select a script (the rest of the prompt changes nothing);
// a context of K tokens that recurs with two continuations is refused; KV caches of 8 bits or more
// keep the copy heads exact, KIVI int2 does not.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace ptllm::test {

// The width and depth of a real model around the script (ScriptedModelSpec::shape), so that a pass
// costs what that model's does: the script's layer is widened to `hidden`, `intermediate` and the
// heads, and `layers - 1` further layers follow it. Everything beyond the script is random (a fixed
// seed) and computed, but every matrix that writes into the residual stream (o_proj, down_proj) is
// zero outside the script's own units, so the residual, and with it every logit, is the one the
// script's model computes (rounding aside: a product's terms are summed in another grouping); the
// residual's added dimensions stay exactly zero. The script's layer stays F32 (its constants are not
// bf16 values); the added layers are BF16, as the real models' weights are. 0 = the script's own.
struct ScriptedShape {
  int layers = 1;
  int hidden = 0;        // at least the script's residual width
  int intermediate = 0;  // at least the script's rules
  int heads = 0;         // query heads; with kv_heads the grouping (heads / kv_heads a group)
  int kv_heads = 0;      // at least the script's heads (each needs its own key and value)
};
// Named shapes: "kjv-small" (8 layers, hidden 512, intermediate 1376, 8 heads over 2 KV heads) and
// "llama-3.2-1b" (16 layers, hidden 2048, intermediate 8192, 32 heads over 8); head_dim stays the
// script's (64 unless its widest slot needs more). Throws ptllm::Error naming an unknown name.
ScriptedShape scripted_shape(const std::string& name);

struct ScriptedModelSpec {
  struct Script {
    std::string text;     // what the model writes, then EOS
    std::string trigger;  // "" = no trigger; else text that encodes to one token
    std::string tail;     // the text the prompt ends with; "" = prompt_tail
  };
  std::vector<Script> scripts;
  // The text every prompt ends with, e.g. "<|im_start|>assistant\n" (Qwen2.5's generation prompt).
  // Its first token is not trusted as context: in a real prompt it may merge with what precedes it.
  std::string prompt_tail;
  std::string chat_template;  // tokenizer_config.json's chat_template; "" = none
  // K: the most tokens (the current one included) a rule may look at. Each rule looks at as few as
  // make its next token unique, so a large K costs width only where a script needs it (the second
  // of two similar tool calls).
  int context_tokens = 64;
  int max_position = 4096;  // config.json max_position_embeddings; the score margins hold up to it
  // The byte-level BPE tokenizer copied into the model (tokenizer.json; vocab 8192, </s> = 1 = EOS).
  std::filesystem::path tokenizer_dir;  // empty = models/kjv-tiny of this repository
  ScriptedShape shape;  // default: one layer of the script's own width
};

struct ScriptedModelInfo {
  std::vector<std::vector<int32_t>> script_ids;  // each script's tokens, as the model emits them
  int distinct_tokens = 0;  // |S|
  int hidden_size = 0;
  int rules = 0;    // MLP units
  int context = 0;  // the most tokens a rule looks at (at most context_tokens)
  int script_hidden = 0;  // the residual dimensions the script uses (hidden_size when not padded)
  int layers = 1;
  int heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
};

// Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
// generation_config.json into out_dir (created if missing). Throws ptllm::Error with a message
// naming the script and the context when the scripts are ambiguous (one context, two next tokens)
// or a script cannot be encoded exactly.
ScriptedModelInfo write_scripted_model(const ScriptedModelSpec& spec, const std::filesystem::path& out_dir);

}  // namespace ptllm::test
