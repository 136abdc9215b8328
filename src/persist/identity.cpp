// The prompt cache's identity: the key of everything a saved KV state depends on but its token ids
// (cache_file.h: PromptCacheIdentity).
#include <sys/stat.h>

#include <optional>
#include <string>
#include <system_error>

#include "core/file_io.h"
#include "core/platform.h"
#include "core/sha256.h"
#include "kernels/affine.h"
#include "kernels/ggml.h"
#include "kernels/simd.h"
#include "model/gguf.h"
#include "model/model.h"
#include "persist/cache_file.h"
#include "tokenizer/tokenizer.h"

namespace ptllm {

namespace fs = std::filesystem;

namespace {

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};
std::optional<FileStamp> stamp(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

std::string read_small_file(const fs::path& p) { return read_whole_file(p, kMaxJsonConfigBytes, "a JSON file"); }

}  // namespace

std::string sanitize_model_name(std::string_view name) {
  std::string s;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    s += ok ? c : '_';
  }
  if (s.empty() || s == "." || s == "..") s = "model";
  return s;
}

PromptCacheIdentity prompt_cache_identity(const Model& model, const Tokenizer& tok, const KVCacheConfig& kv) {
  const ModelConfig& cfg = model.config();
  const KVShape shape = model.kv_shape();
  PromptCacheIdentity id;
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(model.dir(), ec);
  if (ec || dir.filename().empty()) dir = model.dir();
  id.model_name = sanitize_model_name(dir.filename().string());
  id.arch_name = cfg.arch_name;
  id.vocab_size = cfg.vocab_size;
  id.n_layers = shape.n_layers;
  id.n_kv_heads = shape.n_kv_heads;
  id.head_dim = shape.head_dim;
  id.kv = kv;

  Sha256 h;
  h.field("posttrainllm prompt cache key", int64_t(kPromptCacheVersion));
  h.field("architecture", cfg.arch_name);
  if (const GgufFile* g = model.gguf()) {
    // One file holds config, tokenizer and weights: its header and metadata, size and mtime.
    const FileStamp st = stamp(model.dir()).value_or(FileStamp{});
    h.field("gguf", model.dir().filename().string());
    h.field("gguf header", g->header_bytes());
    h.field("size", int64_t(st.size));
    h.field("mtime", st.mtime_ns);
  } else {
    h.field("config.json", read_small_file(model.dir() / "config.json"));
  }
  for (const auto& f : model.files().files()) {
    const FileStamp st = stamp(f->path()).value_or(FileStamp{});
    h.field("weights", f->path().filename().string());
    h.field("size", int64_t(st.size));
    h.field("mtime", st.mtime_ns);
  }
  // The binary and its SIMD target compute the numbers: another build or target may round differently.
  const FileStamp exe = stamp(executable_file()).value_or(FileStamp{});
  h.field("executable size", int64_t(exe.size));
  h.field("executable mtime", exe.mtime_ns);
  h.field("kernels", active_kernels_name());
  // Matrices repacked at load sum in another order than the file's layout: other last bits.
  h.field("affine pack", int64_t(affine_pack_wanted()));
  h.field("ggml pack", int64_t(ggml_pack_wanted()));
  h.field("tokenizer", tok.fingerprint());
  h.field("vocab", id.vocab_size);
  h.field("layers", id.n_layers);
  h.field("kv heads", id.n_kv_heads);
  h.field("head dim", id.head_dim);
  h.field("precision", kv_precision_name(kv.precision));
  h.field("group", kv.group_size);
  h.field("residual", kv.residual);
  h.field("sink", kv.sink);
  h.field("window", kv.window);
  h.field("positions", position_mode_name(kv.positions));
  // The windows decide what is stored (config.json's bytes already differ; this is the key saying so).
  if (shape.any_window())
    for (int w : shape.layer_window) h.field("layer window", int64_t(w));
  // So does which layers store K/V (YOCO's KV-shared layers store none: the state holds the others).
  if (shape.any_shared())
    for (int l = 0; l < shape.n_layers; ++l) h.field("kv source", int64_t(shape.source_of(l)));
  id.config_key = h.digest();
  return id;
}

}  // namespace ptllm
