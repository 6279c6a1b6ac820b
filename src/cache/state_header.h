// The 64-byte header that starts a serialized state and a page export (internal to tern_cache).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tern::cache::detail {

constexpr uint32_t kMagic = 0x34565354;  // "TSV4"
constexpr uint32_t kVersion = 2;         // 2: fixed parts without padding, page geometry in the header
constexpr size_t kHeaderBytes = 64;

struct Header {
  uint32_t magic;
  uint32_t version;
  uint64_t fingerprint;     // StateLayout::fingerprint()
  int64_t position;         // tokens consumed
  int64_t tokens_per_page;  // the writer's page geometry (checked by import_pages only)
  int64_t page_bytes;
};
static_assert(sizeof(Header) <= kHeaderBytes);

}  // namespace tern::cache::detail
