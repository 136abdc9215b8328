#pragma once
// SHA-256 (OpenSSL's libcrypto): the identities of cached states and the tokenizer's fingerprint.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

typedef struct evp_md_ctx_st EVP_MD_CTX;

namespace ptllm {

using Digest = std::array<uint8_t, 32>;  // SHA-256

class Sha256 {
 public:
  Sha256();  // throws ptllm::Error when libcrypto has no SHA-256
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* p, size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // A named, length-prefixed field, so that no two different sets of fields hash the same bytes.
  void field(std::string_view name, std::string_view value);
  void field(std::string_view name, int64_t v) { field(name, std::to_string(v)); }
  Digest digest();

 private:
  EVP_MD_CTX* ctx_;
};

// Lower-case hex digits of `bytes`.
std::string to_hex(std::span<const uint8_t> bytes);

}  // namespace ptllm
