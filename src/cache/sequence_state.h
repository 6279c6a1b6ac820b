// Per-sequence state of DeepSeek-V4 incremental decoding, as plain bytes described by a layout.
//
// One sequence owns one buffer:
//   [header 64 B: magic, version, layout fingerprint, position]
//   [fixed region, per layer: sliding-window ring (window rows), compressor accumulators, indexer
//    compressor accumulators]                                  -- rewritten as tokens arrive
//   [row region, per layer: compressed rows, indexer keys]    -- append-only, entry w at row w
// Every count is a function of the position (tokens consumed): the ring holds positions
// max(0, pos-window) .. pos-1 at slot p % window; a layer with ratio c has pos / c compressed rows. So a
// snapshot is the header plus the fixed region, and rolling back is copying it back: rows appended after
// the snapshot are simply beyond the restored count. An all-zero buffer is the empty sequence (an
// accumulator with sum 0 is empty), so pages can be reset with memset.
//
// The cache knows bytes and row counts only; what a row or an accumulator means is the model's business
// (model/v4_state.cpp builds the LayerSpecs from the config and the KV mode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace tern::cache {

struct LayerSpec {
  int64_t window = 0;                 // ring rows
  int64_t kv_row_bytes = 0;           // bytes of one window row / compressed row
  int ratio = 0;                      // compression ratio; 0: no compressor
  int64_t compressor_acc_floats = 0;  // f32 accumulator state of the attention compressor
  int64_t index_row_bytes = 0;        // bytes of one indexer key; 0: no indexer
  int64_t indexer_acc_floats = 0;     // f32 accumulator state of the indexer's compressor

  bool operator==(const LayerSpec&) const = default;
};

struct Region {
  size_t offset = 0;
  size_t bytes = 0;
};

class StateLayout {
 public:
  StateLayout(std::vector<LayerSpec> layers, int64_t max_tokens);

  struct LayerRegions {
    Region ring, compressor_acc, indexer_acc;  // fixed region
    Region compressed, index_keys;             // row region
    int64_t row_capacity = 0;                  // compressed rows (and indexer keys) that fit
  };

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerSpec& spec(int layer) const { return layers_.at(layer); }
  const LayerRegions& regions(int layer) const { return regions_.at(layer); }
  int64_t max_tokens() const { return max_tokens_; }
  // Header + fixed region: what a snapshot copies.
  size_t fixed_bytes() const { return fixed_bytes_; }
  size_t total_bytes() const { return total_bytes_; }
  // Identifies the layout: states only move between equal layouts.
  uint64_t fingerprint() const { return fingerprint_; }
  // Compressed rows of `layer` after `position` tokens.
  int64_t entries(int layer, int64_t position) const;

 private:
  std::vector<LayerSpec> layers_;
  std::vector<LayerRegions> regions_;
  int64_t max_tokens_;
  size_t fixed_bytes_ = 0, total_bytes_ = 0;
  uint64_t fingerprint_ = 0;
};

// The saved fixed region of a state (for speculative decoding's roll back).
struct Snapshot {
  uint64_t fingerprint = 0;
  int64_t position = 0;
  std::vector<std::byte> fixed;
};

class SequenceState {
 public:
  explicit SequenceState(std::shared_ptr<const StateLayout> layout, Device device = Device::cpu);

  const StateLayout& layout() const { return *layout_; }
  // Where the rings, accumulators and rows live (the header, with the position, stays on the host). A
  // device state supports forward() only: bytes(), snapshots and serialization need a host state.
  Device device() const { return device_; }
  std::shared_ptr<const StateLayout> layout_ptr() const { return layout_; }
  int64_t position() const;
  // Marks n more tokens consumed (the forward step calls this after writing their state).
  void advance(int64_t n);
  // Back to the empty sequence.
  void reset();

  TensorView ring(int layer) const;             // u8 [window, kv_row_bytes]
  TensorView compressor_acc(int layer) const;   // f32 [compressor_acc_floats]
  TensorView indexer_acc(int layer) const;      // f32 [indexer_acc_floats]
  TensorView compressed_rows(int layer) const;  // u8 [row_capacity, kv_row_bytes]
  TensorView index_keys(int layer) const;       // u8 [row_capacity, index_row_bytes]
  int64_t compressed_count(int layer) const { return layout_->entries(layer, position()); }

  // Copies the rows of positions start .. start+n-1 (rows u8 [n, kv_row_bytes]) into the ring; only the
  // last `window` of them land.
  void store_window_rows(int layer, int64_t start, const TensorView& rows);

  std::span<std::byte> bytes();
  std::span<const std::byte> bytes() const;

  Snapshot snapshot() const;
  // Throws unless the snapshot comes from a state of the same layout.
  void restore(const Snapshot& s);

  // A self-contained copy: header, fixed region, and the used rows of the row region.
  std::vector<std::byte> serialize() const;
  // Replaces this state by a serialized one; throws naming what does not match.
  void deserialize(std::span<const std::byte> data);

 private:
  TensorView view(const Region& r, DType dtype, Shape shape) const;

  std::shared_ptr<const StateLayout> layout_;
  Device device_ = Device::cpu;
  Tensor buffer_;         // the whole state on the host; only the header for a device state
  Tensor device_buffer_;  // the whole state (header bytes unused) for a device state
};

}  // namespace tern::cache
