// The 64-byte header at the start of every sequence state buffer (internal to tern_cache).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tern::cache::detail {

constexpr uint32_t kMagic = 0x34565354;  // "TSV4"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;

struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t fingerprint;
  int64_t position;  // tokens consumed
};
static_assert(sizeof(Header) <= kHeaderBytes);

}  // namespace tern::cache::detail
