#pragma once
// What a command loads once and every sequence shares: the model, its tokenizer (when the command
// needs one) and the thread pool.
#include <filesystem>
#include <memory>
#include <optional>

#include "core/thread_pool.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

// A model directory's tokenizer.json (and tokenizer_config.json), a tokenizer.json, or the
// vocabulary embedded in a .gguf file.
Tokenizer load_tokenizer(const std::filesystem::path& path);

struct RuntimeConfig {
  std::filesystem::path model_dir;  // or a .gguf file
  int threads = 0;         // 0: ThreadPool::default_threads()
  bool tokenizer = true;   // load tokenizer.json (bench needs none)
};

class Runtime {
 public:
  // Throws ptllm::Error naming the file when the model or the tokenizer cannot be loaded.
  explicit Runtime(const RuntimeConfig& cfg);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Model& model() const { return *model_; }
  const ModelConfig& config() const { return model_->config(); }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  const Tokenizer& tokenizer() const;
  ThreadPool& pool() { return pool_; }
  double load_ms() const { return load_ms_; }

 private:
  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tokenizer_;
  ThreadPool pool_;
  double load_ms_ = 0;
};

}  // namespace ptllm
