#include "cache/sequence_state.h"
#include "cache/state_header.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace tern::cache {
namespace {

using detail::Header;
using detail::kHeaderBytes;
using detail::kMagic;
using detail::kVersion;
constexpr size_t kAlign = 64;

size_t align_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

Region take(size_t& cursor, size_t bytes) {
  Region r{cursor, bytes};
  cursor = align_up(cursor + bytes);
  return r;
}

uint64_t fnv1a(uint64_t h, int64_t value) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint64_t>(value >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

StateLayout::StateLayout(std::vector<LayerSpec> layers, int64_t max_tokens)
    : layers_(std::move(layers)), max_tokens_(max_tokens) {
  TERN_CHECK(max_tokens > 0, "state layout: max_tokens must be positive, found ", max_tokens);
  size_t cursor = kHeaderBytes;
  uint64_t h = fnv1a(0xcbf29ce484222325ull, max_tokens);
  regions_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    TERN_CHECK(s.window > 0 && s.kv_row_bytes > 0 && s.ratio >= 0, "state layout: layer ", l,
               " needs a positive window and row size");
    regions_[l].ring = take(cursor, s.window * s.kv_row_bytes);
    regions_[l].compressor_acc = take(cursor, s.compressor_acc_floats * sizeof(float));
    regions_[l].indexer_acc = take(cursor, s.indexer_acc_floats * sizeof(float));
    for (int64_t v : {s.window, s.kv_row_bytes, static_cast<int64_t>(s.ratio), s.compressor_acc_floats,
                      s.index_row_bytes, s.indexer_acc_floats})
      h = fnv1a(h, v);
  }
  fixed_bytes_ = cursor;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    const int64_t rows = s.ratio > 0 ? max_tokens / s.ratio : 0;
    regions_[l].row_capacity = rows;
    regions_[l].compressed = take(cursor, rows * s.kv_row_bytes);
    regions_[l].index_keys = take(cursor, rows * s.index_row_bytes);
  }
  total_bytes_ = cursor;
  fingerprint_ = h;
}

int64_t StateLayout::entries(int layer, int64_t position) const {
  const int ratio = spec(layer).ratio;
  return ratio > 0 ? position / ratio : 0;
}

SequenceState::SequenceState(std::shared_ptr<const StateLayout> layout, Device device)
    : layout_(std::move(layout)),
      device_(device),
      buffer_(DType::u8,
              {static_cast<int64_t>(device == Device::cpu ? layout_->total_bytes() : detail::kHeaderBytes)}) {
  if (device_ != Device::cpu)
    device_buffer_ = Tensor(DType::u8, {static_cast<int64_t>(layout_->total_bytes())}, device_);
  reset();
}

int64_t SequenceState::position() const {
  Header h;
  std::memcpy(&h, buffer_.data<std::byte>(), sizeof h);
  return h.position;
}

void SequenceState::advance(int64_t n) {
  TERN_CHECK(n >= 0 && position() + n <= layout_->max_tokens(), "sequence state: ", position() + n,
             " tokens exceed the state's capacity of ", layout_->max_tokens());
  const int64_t pos = position() + n;
  std::memcpy(buffer_.data<std::byte>() + offsetof(Header, position), &pos, sizeof pos);
}

void SequenceState::reset() {
  if (device_ != Device::cpu) {
    device_memory(device_).fill(device_buffer_.data<std::byte>(), 0, layout_->fixed_bytes());
    std::memset(buffer_.data<std::byte>(), 0, buffer_.nbytes());
  } else {
    std::memset(buffer_.data<std::byte>(), 0, layout_->fixed_bytes());
  }
  const Header h{kMagic, kVersion, layout_->fingerprint(), 0};
  std::memcpy(buffer_.data<std::byte>(), &h, sizeof h);
}

TensorView SequenceState::view(const Region& r, DType dtype, Shape shape) const {
  if (device_ != Device::cpu)
    return TensorView(device_buffer_.data<std::byte>() + r.offset, dtype, shape, device_);
  return TensorView(buffer_.data<std::byte>() + r.offset, dtype, shape);
}

TensorView SequenceState::ring(int l) const {
  const LayerSpec& s = layout_->spec(l);
  return view(layout_->regions(l).ring, DType::u8, {s.window, s.kv_row_bytes});
}

TensorView SequenceState::compressor_acc(int l) const {
  return view(layout_->regions(l).compressor_acc, DType::f32, {layout_->spec(l).compressor_acc_floats});
}

TensorView SequenceState::indexer_acc(int l) const {
  return view(layout_->regions(l).indexer_acc, DType::f32, {layout_->spec(l).indexer_acc_floats});
}

TensorView SequenceState::compressed_rows(int l) const {
  const auto& r = layout_->regions(l);
  return view(r.compressed, DType::u8, {r.row_capacity, layout_->spec(l).kv_row_bytes});
}

TensorView SequenceState::index_keys(int l) const {
  const auto& r = layout_->regions(l);
  return view(r.index_keys, DType::u8, {r.row_capacity, layout_->spec(l).index_row_bytes});
}

void SequenceState::store_window_rows(int l, int64_t start, const TensorView& rows) {
  const LayerSpec& s = layout_->spec(l);
  TERN_CHECK(rows.rank() == 2 && rows.dim(1) == s.kv_row_bytes, "store_window_rows: rows ",
             rows.shape().str(), " must be [n, ", s.kv_row_bytes, "]");
  const int64_t n = rows.dim(0);
  const TensorView ring_rows = ring(l);
  if (device_ != Device::cpu || rows.device() != Device::cpu) {
    // At most two contiguous runs (the ring wraps once).
    for (int64_t i = std::max<int64_t>(0, n - s.window); i < n;) {
      const int64_t slot = (start + i) % s.window;
      const int64_t run = std::min(n - i, s.window - slot);
      copy_view(rows.rows(i, i + run), ring_rows.rows(slot, slot + run));
      i += run;
    }
    return;
  }
  std::byte* ring_bytes = ring_rows.data_as<std::byte>();
  for (int64_t i = std::max<int64_t>(0, n - s.window); i < n; ++i)
    std::memcpy(ring_bytes + ((start + i) % s.window) * s.kv_row_bytes,
                rows.data_as<const std::byte>() + i * s.kv_row_bytes, s.kv_row_bytes);
}

std::span<std::byte> SequenceState::bytes() {
  TERN_CHECK(device_ == Device::cpu, "sequence state: bytes() of a device state (copy it to the host first)");
  return {buffer_.data<std::byte>(), layout_->total_bytes()};
}
std::span<const std::byte> SequenceState::bytes() const {
  TERN_CHECK(device_ == Device::cpu, "sequence state: bytes() of a device state (copy it to the host first)");
  return {buffer_.data<const std::byte>(), layout_->total_bytes()};
}

}  // namespace tern::cache
