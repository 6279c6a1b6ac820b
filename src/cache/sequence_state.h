// Per-sequence state of DeepSeek-V4 incremental decoding, in pages of a PagePool (layout: state_layout.h).
//
// A sequence owns its block table: its fixed pages (rings, accumulators), then one row page per
// tokens_per_page tokens (compressed rows, indexer keys), taken from the pool as it grows and given back
// when the state is destroyed. Every count is a function of the position (tokens consumed, kept here on
// the host): the ring holds positions max(0, pos-window) .. pos-1 at slot p % window; a layer with ratio c
// has pos / c compressed rows. So a snapshot is the position plus the fixed pages, and rolling back is
// copying them back: rows appended after the snapshot are simply beyond the restored count. All-zero fixed
// pages are the empty sequence (an accumulator with sum 0 is empty), so reset() is a memset.
//
// Host and device states behave alike: the pages are on the pool's device, the block table and position on
// the host (and, for a device state, the row part of the block table mirrored on the device for the ops).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cache/page_pool.h"
#include "cache/state_layout.h"
#include "core/paged_rows.h"
#include "core/tensor.h"

namespace tern::cache {

// The saved fixed pages of a state (for speculative decoding's roll back).
struct Snapshot {
  uint64_t fingerprint = 0;
  int64_t position = 0;
  std::vector<std::byte> fixed;  // the fixed pages, in block-table order, on the host (snapshot())
  TensorView slot;               // or in memory the caller reserved (snapshot_into()), on any device
};

// A run of rows [first, first + rows.dim(0)) that lie in one page: u8 [n, row_bytes] (for writing rows).
struct RowRun {
  int64_t first = 0;
  TensorView rows;
};

class SequenceState {
 public:
  // A fresh (reset) state in `pool`'s pages, with row pages for `tokens` positions; throws naming the
  // pages needed and free when the pool is short.
  explicit SequenceState(std::shared_ptr<PagePool> pool, int64_t tokens = 0);
  // A standalone state for up to layout->max_tokens() positions: its own pool of exactly the pages it needs.
  explicit SequenceState(std::shared_ptr<const StateLayout> layout, Device device = Device::cpu);
  ~SequenceState();  // gives the pages back
  SequenceState(SequenceState&& other) noexcept;
  SequenceState& operator=(SequenceState&& other) noexcept;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  const StateLayout& layout() const { return pool_->layout(); }
  std::shared_ptr<const StateLayout> layout_ptr() const { return pool_->layout_ptr(); }
  const PagePool& pool() const { return *pool_; }
  Device device() const { return pool_->device(); }
  int64_t position() const { return position_; }
  // Marks n more tokens consumed (the forward step calls this after writing their state).
  void advance(int64_t n);
  // Back to the empty sequence (its pages stay reserved).
  void reset();

  // Grows the row pages to hold `tokens` positions; false (and no change) when the pool has too few free
  // pages. Throws beyond the layout's max_tokens.
  bool reserve(int64_t tokens);
  // Positions the reserved pages hold.
  int64_t capacity() const;
  // Fixed pages, then row pages.
  const std::vector<int32_t>& block_table() const { return table_; }
  int64_t pages_held() const { return static_cast<int64_t>(table_.size()); }

  TensorView ring(int layer) const;            // u8 [window, kv_row_bytes]
  TensorView compressor_acc(int layer) const;  // f32 [compressor_acc_floats]
  TensorView indexer_acc(int layer) const;     // f32 [indexer_acc_floats]
  TensorView carry(int layer) const;           // f32 [carry_floats]
  // The reserved rows, paged (block table on the state's device); empty for a layer without compressor.
  PagedRows compressed_rows(int layer) const;  // rows of kv_row_bytes
  PagedRows index_keys(int layer) const;       // rows of index_row_bytes
  // Rows [begin, end) of compressed_rows (keys false) or index_keys (true), as runs within one page each.
  std::vector<RowRun> row_runs(int layer, bool keys, int64_t begin, int64_t end) const;
  int64_t compressed_count(int layer) const { return layout().entries(layer, position()); }

  // Copies the rows of positions start .. start+n-1 (rows u8 [n, kv_row_bytes]) into the ring; only the
  // last `window` of them land.
  void store_window_rows(int layer, int64_t start, const TensorView& rows);

  Snapshot snapshot() const;
  // The same into `slot` (u8, at least snapshot_bytes(), typically on the state's device: no host round trip),
  // which must outlive the snapshot's use: what a server reserves per running sequence up front.
  Snapshot snapshot_into(const TensorView& slot) const;
  int64_t snapshot_bytes() const { return layout().fixed_pages() * layout().page_bytes(); }
  // Throws unless the snapshot comes from a state of the same layout and fits the reserved pages.
  void restore(const Snapshot& s);

  // A self-contained copy that does not depend on pages: header, fixed parts, and the used rows.
  std::vector<std::byte> serialize() const;
  // Replaces this state by a serialized one (of equal layer specs; pages for its position must be reserved
  // first); throws naming what does not match, changing nothing.
  void deserialize(std::span<const std::byte> data);

  // Page-wise transfer: a 64-byte header (position, layout fingerprint, page geometry), then the first
  // pages_used() pages of the block table (fixed pages, then the row pages holding the used rows), whole.
  // A transfer reads page(i) on one side and writes page(i) of a state that reserved the position on the
  // other, then calls import_header().
  int64_t pages_used() const { return layout().pages_for(position()); }
  TensorView page(int64_t i) const;  // u8 [page_bytes] of block-table entry i, on the state's device
  std::vector<std::byte> export_header() const;
  // Checks a header from export_header() against this state (layout, page geometry, reserved pages) and
  // takes its position; throws naming what does not match, changing nothing.
  void import_header(std::span<const std::byte> header);
  // Header and pages in one buffer, and back: what a prefill-decode transfer moves.
  size_t export_bytes() const;
  // Writes the header and pages into `dst` (u8, export_bytes(), on the host or on this state's device) and
  // returns when they are there. From a device state to the host the pages are gathered on the device
  // first and cross in one copy (a few hundred small copies to the host would each wait).
  void export_to(const TensorView& dst) const;
  // Reads an export (on the host or this state's device; one copy to the device, then page copies there)
  // and returns when it is in place. Checks as import_header() does, changing nothing when it throws.
  void import_from(const TensorView& src);
  std::vector<std::byte> export_pages() const;          // export_to() a host buffer
  void import_pages(std::span<const std::byte> data);  // import_from() a host buffer

 private:
  TensorView fixed_part(const PagePlace& p, DType dtype, Shape shape) const;
  PagedRows paged(int layer, bool keys) const;
  int64_t row_pages_held() const { return pages_held() - layout().fixed_pages(); }
  void release();

  std::shared_ptr<PagePool> pool_;
  std::vector<int32_t> table_;
  Tensor device_table_;  // i32 [row pages for max_tokens]: the row part of table_, for a device state
  int64_t position_ = 0;
};

}  // namespace tern::cache
