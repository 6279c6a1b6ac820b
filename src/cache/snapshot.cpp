// Snapshot / restore (speculative decoding's roll back) and serialization (moving a state to another
// process): both rely on every count being a function of the position (see sequence_state.h).
#include <cstring>

#include "cache/sequence_state.h"
#include "cache/state_header.h"

namespace tern::cache {
namespace {

using detail::kMagic;
using detail::kVersion;

// Bytes of the row region in use after `position` tokens, per layer and kind, in serialization order.
template <typename Fn>
void for_used_rows(const StateLayout& layout, int64_t position, Fn&& fn) {
  for (int l = 0; l < layout.num_layers(); ++l) {
    const int64_t entries = layout.entries(l, position);
    const auto& r = layout.regions(l);
    fn(r.compressed.offset, static_cast<size_t>(entries * layout.spec(l).kv_row_bytes));
    fn(r.index_keys.offset, static_cast<size_t>(entries * layout.spec(l).index_row_bytes));
  }
}

}  // namespace

Snapshot SequenceState::snapshot() const {
  Snapshot s;
  s.fingerprint = layout_->fingerprint();
  s.position = position();
  const auto all = bytes();
  s.fixed.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(layout_->fixed_bytes()));
  return s;
}

void SequenceState::restore(const Snapshot& s) {
  TERN_CHECK(s.fingerprint == layout_->fingerprint() && s.fixed.size() == layout_->fixed_bytes(),
             "restore: the snapshot was taken from a state of another layout");
  std::memcpy(bytes().data(), s.fixed.data(), s.fixed.size());
}

std::vector<std::byte> SequenceState::serialize() const {
  const auto all = bytes();
  std::vector<std::byte> out(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(layout_->fixed_bytes()));
  for_used_rows(*layout_, position(), [&](size_t offset, size_t n) {
    out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(offset),
               all.begin() + static_cast<std::ptrdiff_t>(offset + n));
  });
  return out;
}

void SequenceState::deserialize(std::span<const std::byte> data) {
  detail::Header h{};
  TERN_CHECK(data.size() >= layout_->fixed_bytes(), "deserialize: ", data.size(),
             " bytes is shorter than the state's fixed region of ", layout_->fixed_bytes());
  std::memcpy(&h, data.data(), sizeof h);
  TERN_CHECK(h.magic == kMagic, "deserialize: not a tern sequence state (bad magic)");
  TERN_CHECK(h.version == kVersion, "deserialize: state version ", h.version, ", this build reads ",
             kVersion);
  TERN_CHECK(h.fingerprint == layout_->fingerprint(),
             "deserialize: the state was written for another model or state layout");
  TERN_CHECK(h.position >= 0 && h.position <= layout_->max_tokens(), "deserialize: position ", h.position,
             " outside [0, ", layout_->max_tokens(), "]");
  size_t expected = layout_->fixed_bytes();
  for_used_rows(*layout_, h.position, [&](size_t, size_t n) { expected += n; });
  TERN_CHECK(data.size() == expected, "deserialize: expected ", expected, " bytes for position ", h.position,
             ", found ", data.size());
  const auto all = bytes();
  std::memcpy(all.data(), data.data(), layout_->fixed_bytes());
  size_t cursor = layout_->fixed_bytes();
  for_used_rows(*layout_, h.position, [&](size_t offset, size_t n) {
    std::memcpy(all.data() + offset, data.data() + cursor, n);
    cursor += n;
  });
}

}  // namespace tern::cache
