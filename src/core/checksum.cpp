#include "core/checksum.h"

#include <new>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3_64bits and XXH3_64bits_update become their dispatching forms
#endif

namespace ptllm {

uint64_t checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

Checksum64::Checksum64() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
Checksum64::~Checksum64() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Checksum64::update(const void* data, size_t n) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n); }
uint64_t Checksum64::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

}  // namespace ptllm
