// Snapshot / restore (speculative decoding's roll back), serialization (moving a state to another process)
// and page-wise export / import: all rely on every count being a function of the position
// (sequence_state.h). Copies go through core's copy_view, so device states work the same.
#include <cstring>

#include "cache/sequence_state.h"
#include "cache/state_header.h"
#include "core/error.h"

namespace tern::cache {
namespace {

using detail::Header;
using detail::kHeaderBytes;
using detail::kMagic;
using detail::kVersion;

TensorView host_bytes(const std::byte* p, size_t n) {
  return TensorView(const_cast<std::byte*>(p), DType::u8, {static_cast<int64_t>(n)});
}

Header read_header(std::span<const std::byte> data, const char* what, const StateLayout& layout) {
  Header h{};
  TERN_CHECK(data.size() >= kHeaderBytes, what, ": ", data.size(), " bytes is shorter than the ", kHeaderBytes,
             "-byte header");
  std::memcpy(&h, data.data(), sizeof h);
  TERN_CHECK(h.magic == kMagic, what, ": not a tern sequence state (bad magic)");
  TERN_CHECK(h.version == kVersion, what, ": state version ", h.version, ", this build reads ", kVersion);
  TERN_CHECK(h.fingerprint == layout.fingerprint(), what, ": the state was written for another model or state layout");
  TERN_CHECK(h.position >= 0 && h.position <= layout.max_tokens(), what, ": position ", h.position, " outside [0, ",
             layout.max_tokens(), "]");
  return h;
}

}  // namespace

// The state's parts in serialization order: the fixed parts, then per layer its used compressed rows and
// indexer keys (as runs within a page). fn(view) gets each as a contiguous view on the state's device.
template <typename Fn>
static void for_each_part(const SequenceState& s, int64_t position, Fn&& fn) {
  const StateLayout& l = s.layout();
  for (int layer = 0; layer < l.num_layers(); ++layer)
    for (const TensorView& v : {s.ring(layer), s.compressor_acc(layer), s.indexer_acc(layer), s.carry(layer)})
      if (v.nbytes() > 0) fn(TensorView(v.data(), DType::u8, {static_cast<int64_t>(v.nbytes())}, v.device()));
  for (int layer = 0; layer < l.num_layers(); ++layer) {
    const int64_t n = l.entries(layer, position);
    for (bool keys : {false, true}) {
      if ((keys ? l.spec(layer).index_row_bytes : l.spec(layer).kv_row_bytes) == 0 || n == 0) continue;
      for (const RowRun& run : s.row_runs(layer, keys, 0, n)) fn(run.rows);
    }
  }
}

Snapshot SequenceState::snapshot() const {
  Snapshot s;
  s.fingerprint = layout().fingerprint();
  s.position = position_;
  const auto page_bytes = static_cast<size_t>(layout().page_bytes());
  s.fixed.resize(static_cast<size_t>(layout().fixed_pages()) * page_bytes);
  for (int64_t i = 0; i < layout().fixed_pages(); ++i)
    copy_view(page(i), host_bytes(s.fixed.data() + static_cast<size_t>(i) * page_bytes, page_bytes));
  return s;
}

Snapshot SequenceState::snapshot_into(const TensorView& slot) const {
  const int64_t page_bytes = layout().page_bytes();
  TERN_CHECK(slot.dtype() == DType::u8 && slot.is_contiguous() && slot.nbytes() >= static_cast<size_t>(snapshot_bytes()),
             "snapshot_into: the slot holds ", slot.nbytes(), " contiguous bytes, the fixed pages take ", snapshot_bytes());
  Snapshot s;
  s.fingerprint = layout().fingerprint();
  s.position = position_;
  s.slot = TensorView(slot.data(), DType::u8, {snapshot_bytes()}, slot.device());
  for (int64_t i = 0; i < layout().fixed_pages(); ++i) copy_view(page(i), s.slot.rows(i * page_bytes, (i + 1) * page_bytes));
  return s;
}

void SequenceState::restore(const Snapshot& s) {
  const int64_t page_bytes = layout().page_bytes();
  const auto saved = static_cast<int64_t>(s.slot.empty() ? s.fixed.size() : s.slot.nbytes());
  TERN_CHECK(s.fingerprint == layout().fingerprint() && saved == snapshot_bytes(),
             "restore: the snapshot was taken from a state of another layout");
  TERN_CHECK(s.position >= 0 && s.position <= capacity(), "restore: position ", s.position,
             " beyond the state's capacity of ", capacity());
  for (int64_t i = 0; i < layout().fixed_pages(); ++i) {
    const TensorView from = s.slot.empty()
                                ? host_bytes(s.fixed.data() + static_cast<size_t>(i * page_bytes), static_cast<size_t>(page_bytes))
                                : s.slot.rows(i * page_bytes, (i + 1) * page_bytes);
    copy_view(from, page(i));
  }
  position_ = s.position;
}

std::vector<std::byte> SequenceState::serialize() const {
  std::vector<std::byte> out(layout().serialized_bytes(position_));
  const Header h{kMagic, kVersion, layout().fingerprint(), position_, 0, 0};  // no page geometry: not paged
  std::memcpy(out.data(), &h, sizeof h);
  size_t cursor = kHeaderBytes;
  for_each_part(*this, position_, [&](const TensorView& part) {
    copy_view(part, host_bytes(out.data() + cursor, part.nbytes()));
    cursor += part.nbytes();
  });
  TERN_CHECK(cursor == out.size(), "serialize: wrote ", cursor, " of ", out.size(), " bytes (layout bug)");
  return out;
}

void SequenceState::deserialize(std::span<const std::byte> data) {
  const Header h = read_header(data, "deserialize", layout());
  const size_t expected = layout().serialized_bytes(h.position);
  TERN_CHECK(data.size() == expected, "deserialize: expected ", expected, " bytes for position ", h.position,
             ", found ", data.size());
  TERN_CHECK(h.position <= capacity(), "deserialize: the state has ", h.position, " tokens; this one has pages for ",
             capacity(), " (reserve(", h.position, ") first)");
  size_t cursor = kHeaderBytes;
  for_each_part(*this, h.position, [&](const TensorView& part) {
    copy_view(host_bytes(data.data() + cursor, part.nbytes()), part);
    cursor += part.nbytes();
  });
  position_ = h.position;
}

std::vector<std::byte> SequenceState::export_header() const {
  std::vector<std::byte> out(kHeaderBytes);
  const Header h{kMagic, kVersion, layout().fingerprint(), position_, layout().tokens_per_page(), layout().page_bytes()};
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

// The checks of import_header(); returns the header's position.
static int64_t check_import(const SequenceState& s, std::span<const std::byte> header, const char* what) {
  TERN_CHECK(header.size() >= kHeaderBytes, what, ": ", header.size(), " bytes is shorter than the ", kHeaderBytes,
             "-byte header");
  const StateLayout& l = s.layout();
  const Header h = read_header(header, what, l);
  TERN_CHECK(h.tokens_per_page == l.tokens_per_page() && h.page_bytes == l.page_bytes(), what, ": pages of ",
             h.page_bytes, " B for ", h.tokens_per_page, " tokens, this state's are ", l.page_bytes(), " B for ",
             l.tokens_per_page());
  TERN_CHECK(h.position <= s.capacity(), what, ": the state has ", h.position, " tokens; this one has pages for ",
             s.capacity(), " (reserve(", h.position, ") first)");
  return h.position;
}

void SequenceState::import_header(std::span<const std::byte> header) {
  TERN_CHECK(header.size() == kHeaderBytes, "import_header: ", header.size(), " bytes, expected ", kHeaderBytes);
  position_ = check_import(*this, header, "import_header");
}

size_t SequenceState::export_bytes() const {
  return kHeaderBytes + static_cast<size_t>(pages_used()) * static_cast<size_t>(layout().page_bytes());
}

// Bytes [at, at + n) of a contiguous u8 view, on its device.
static TensorView byte_range(const TensorView& v, size_t at, size_t n) {
  return TensorView(v.data_as<std::byte>() + at, DType::u8, {static_cast<int64_t>(n)}, v.device());
}

static void synchronize(Device d) {
  if (d != Device::cpu) device_memory(d).synchronize();
}

void SequenceState::export_to(const TensorView& dst) const {
  const size_t bytes = export_bytes();
  TERN_CHECK(dst.nbytes() == bytes && dst.is_contiguous(), "export_to: the buffer holds ", dst.nbytes(),
             " bytes, the export ", bytes);
  TERN_CHECK(dst.device() == Device::cpu || dst.device() == device(), "export_to: the buffer is on another device");
  const auto page_bytes = static_cast<size_t>(layout().page_bytes());
  const std::vector<std::byte> header = export_header();
  copy_view(host_bytes(header.data(), kHeaderBytes), byte_range(dst, 0, kHeaderBytes));
  const TensorView pages = byte_range(dst, kHeaderBytes, bytes - kHeaderBytes);
  Tensor staging;  // a device state exported to the host: gathered on the device, then one copy
  if (dst.device() != device()) staging = Tensor(DType::u8, {static_cast<int64_t>(pages.nbytes())}, device());
  const TensorView& gather = dst.device() == device() ? pages : staging.view();
  for (int64_t i = 0; i < pages_used(); ++i)
    copy_view(page(i), byte_range(gather, static_cast<size_t>(i) * page_bytes, page_bytes));
  if (!staging.empty()) copy_view(staging.view(), pages);
  synchronize(dst.device());
}

void SequenceState::import_from(const TensorView& src) {
  TERN_CHECK(src.is_contiguous() && src.nbytes() >= kHeaderBytes, "import_from: ", src.nbytes(),
             " bytes is shorter than the ", kHeaderBytes, "-byte header");
  TERN_CHECK(src.device() == Device::cpu || src.device() == device(), "import_from: the bytes are on another device");
  std::vector<std::byte> header(kHeaderBytes);
  copy_view(byte_range(src, 0, kHeaderBytes), host_bytes(header.data(), kHeaderBytes));
  const int64_t position = check_import(*this, header, "import_from");
  const auto page_bytes = static_cast<size_t>(layout().page_bytes());
  const int64_t pages = layout().pages_for(position);
  const size_t expected = kHeaderBytes + static_cast<size_t>(pages) * page_bytes;
  TERN_CHECK(src.nbytes() == expected, "import_from: expected ", expected, " bytes (", pages, " pages) for position ",
             position, ", found ", src.nbytes());
  const TensorView body = byte_range(src, kHeaderBytes, expected - kHeaderBytes);
  // Host bytes for a device state cross in one copy, then spread to the pages on the device.
  const Tensor staging = src.device() == device() ? Tensor() : Tensor::copy_of(body, device());
  const TensorView& from = staging.empty() ? body : staging.view();
  for (int64_t i = 0; i < pages; ++i)
    copy_view(byte_range(from, static_cast<size_t>(i) * page_bytes, page_bytes), page(i));
  synchronize(device());  // the source may be reused (a transfer's landing) once this returns
  position_ = position;
}

std::vector<std::byte> SequenceState::export_pages() const {
  std::vector<std::byte> out(export_bytes());
  export_to(host_bytes(out.data(), out.size()));
  return out;
}

void SequenceState::import_pages(std::span<const std::byte> data) { import_from(host_bytes(data.data(), data.size())); }

}  // namespace tern::cache
