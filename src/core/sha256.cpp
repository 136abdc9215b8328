#include "core/sha256.h"

#include <openssl/evp.h>

#include "core/error.h"

namespace ptllm {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw Error("SHA-256 is not available");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(const void* p, size_t n) {
  if (EVP_DigestUpdate(ctx_, p, n) != 1) throw Error("SHA-256 failed");
}

void Sha256::field(std::string_view name, std::string_view value) {
  const uint64_t n = value.size();
  update(name);
  update(&n, sizeof n);
  update(value);
}

Digest Sha256::digest() {
  Digest d{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_, d.data(), &len) != 1 || len != d.size()) throw Error("SHA-256 failed");
  return d;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

}  // namespace ptllm
