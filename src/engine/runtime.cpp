#include "engine/runtime.h"

#include <chrono>

#include "core/error.h"
#include "model/gguf_model.h"

namespace ptllm {

namespace {
int resolve(int threads) { return threads > 0 ? threads : ThreadPool::default_threads(); }
}  // namespace

Tokenizer load_tokenizer(const std::filesystem::path& path) {
  if (is_gguf_path(path)) return tokenizer_from_gguf_vocab(gguf_vocab(GgufFile::open(path)));
  return Tokenizer::load(path);
}

Runtime::Runtime(const RuntimeConfig& cfg) : pool_(resolve(cfg.threads)) {
  const auto t0 = std::chrono::steady_clock::now();
  model_ = Model::load(cfg.model_dir);
  if (cfg.tokenizer)
    tokenizer_.emplace(model_->gguf() ? tokenizer_from_gguf_vocab(gguf_vocab(*model_->gguf()))
                                      : Tokenizer::load(cfg.model_dir));
  load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

const Tokenizer& Runtime::tokenizer() const {
  PTLLM_CHECK(tokenizer_.has_value());
  return *tokenizer_;
}

}  // namespace ptllm
