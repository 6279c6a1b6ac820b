#include "cache/sequence_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tern::cache {

SequenceState::SequenceState(std::shared_ptr<PagePool> pool, int64_t tokens) : pool_(std::move(pool)) {
  TERN_CHECK(pool_ != nullptr, "sequence state: no pool");
  const StateLayout& l = layout();
  TERN_CHECK(tokens >= 0 && tokens <= l.max_tokens(), "sequence state: ", tokens,
             " tokens outside the layout's [0, ", l.max_tokens(), "]");
  const int64_t need = l.pages_for(tokens);
  TERN_CHECK(pool_->take(need, table_), "state pool: a sequence of ", tokens, " tokens needs ", need,
             " pages of ", l.page_bytes(), " B, ", pool_->free_pages(), " of ", pool_->total_pages(), " are free");
  try {
    if (device() != Device::cpu) {
      device_table_ = Tensor(DType::i32, {std::max<int64_t>(1, l.row_pages_for(l.max_tokens()))}, device());
      const int64_t rows = row_pages_held();
      copy_view(TensorView(table_.data() + l.fixed_pages(), DType::i32, {rows}), device_table_.view().rows(0, rows));
    }
    reset();
  } catch (...) {
    release();
    throw;
  }
}

SequenceState::SequenceState(std::shared_ptr<const StateLayout> layout, Device device)
    : SequenceState(std::make_shared<PagePool>(layout, layout->pages_for(layout->max_tokens()), device),
                    layout->max_tokens()) {}

SequenceState::~SequenceState() { release(); }

SequenceState::SequenceState(SequenceState&& o) noexcept
    : pool_(std::move(o.pool_)),
      table_(std::move(o.table_)),
      device_table_(std::move(o.device_table_)),
      position_(o.position_) {
  o.table_.clear();
}

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    table_ = std::move(o.table_);
    o.table_.clear();
    device_table_ = std::move(o.device_table_);
    position_ = o.position_;
  }
  return *this;
}

void SequenceState::release() {
  if (pool_ && !table_.empty()) pool_->give_back(table_);
  table_.clear();
}

void SequenceState::advance(int64_t n) {
  TERN_CHECK(n >= 0 && position_ + n <= capacity(), "sequence state: ", position_ + n,
             " tokens exceed the state's capacity of ", capacity(), " (reserve pages first)");
  position_ += n;
}

void SequenceState::reset() {
  for (int64_t i = 0; i < layout().fixed_pages(); ++i) {
    const TensorView p = page(i);
    if (device() == Device::cpu)
      std::memset(p.data(), 0, p.nbytes());
    else
      device_memory(device()).fill(p.data(), 0, p.nbytes());
  }
  position_ = 0;
}

bool SequenceState::reserve(int64_t tokens) {
  const StateLayout& l = layout();
  TERN_CHECK(tokens >= 0 && tokens <= l.max_tokens(), "sequence state: cannot reserve ", tokens,
             " tokens (the layout holds at most ", l.max_tokens(), ")");
  const int64_t held = row_pages_held(), need = l.row_pages_for(tokens) - held;
  if (need <= 0) return true;
  if (!pool_->take(need, table_)) return false;
  if (device() != Device::cpu)
    copy_view(TensorView(table_.data() + l.fixed_pages() + held, DType::i32, {need}),
              device_table_.view().rows(held, held + need));
  return true;
}

int64_t SequenceState::capacity() const {
  const StateLayout& l = layout();
  if (l.row_page_used_bytes() == 0) return l.max_tokens();
  return std::min(l.max_tokens(), row_pages_held() * l.tokens_per_page());
}

TensorView SequenceState::page(int64_t i) const {
  TERN_CHECK(i >= 0 && i < pages_held(), "sequence state: page ", i, " of ", pages_held());
  return pool_->page(table_[static_cast<size_t>(i)]);
}

TensorView SequenceState::fixed_part(const PagePlace& p, DType dtype, Shape shape) const {
  return TensorView(page(p.page).data_as<std::byte>() + p.offset, dtype, shape, device());
}

TensorView SequenceState::ring(int l) const {
  const LayerSpec& s = layout().spec(l);
  return fixed_part(layout().places(l).ring, DType::u8, {s.window, s.kv_row_bytes});
}

TensorView SequenceState::compressor_acc(int l) const {
  return fixed_part(layout().places(l).compressor_acc, DType::f32, {layout().spec(l).compressor_acc_floats});
}

TensorView SequenceState::indexer_acc(int l) const {
  return fixed_part(layout().places(l).indexer_acc, DType::f32, {layout().spec(l).indexer_acc_floats});
}

TensorView SequenceState::carry(int l) const {
  return fixed_part(layout().places(l).carry, DType::f32, {layout().spec(l).carry_floats});
}

PagedRows SequenceState::paged(int l, bool keys) const {
  const LayerSpec& s = layout().spec(l);
  const StateLayout::LayerPlaces& p = layout().places(l);
  if (s.ratio == 0) return {};
  const int64_t pages = row_pages_held();
  PagedRows r;
  r.pool = pool_->memory();
  r.block_table = device() == Device::cpu
                      ? TensorView(const_cast<int32_t*>(table_.data()) + layout().fixed_pages(), DType::i32, {pages})
                      : device_table_.view().rows(0, pages);
  r.offset_in_page = keys ? p.index_keys_offset : p.compressed_offset;
  r.rows_per_page = p.rows_per_page;
  r.row_bytes = keys ? s.index_row_bytes : s.kv_row_bytes;
  return r;
}

PagedRows SequenceState::compressed_rows(int l) const { return paged(l, false); }
PagedRows SequenceState::index_keys(int l) const { return paged(l, true); }

std::vector<RowRun> SequenceState::row_runs(int l, bool keys, int64_t begin, int64_t end) const {
  const LayerSpec& s = layout().spec(l);
  const StateLayout::LayerPlaces& p = layout().places(l);
  const int64_t rpp = p.rows_per_page, rb = keys ? s.index_row_bytes : s.kv_row_bytes;
  TERN_CHECK(0 <= begin && begin <= end && (begin == end || end <= row_pages_held() * rpp), "sequence state: rows [",
             begin, ", ", end, ") of layer ", l, " beyond the ", row_pages_held() * rpp, " reserved");
  std::vector<RowRun> runs;
  for (int64_t r = begin; r < end;) {
    const int64_t in = r % rpp, n = std::min(end - r, rpp - in);
    std::byte* base = page(layout().fixed_pages() + r / rpp).data_as<std::byte>();
    runs.push_back({r - begin, TensorView(base + (keys ? p.index_keys_offset : p.compressed_offset) + in * rb,
                                          DType::u8, {n, rb}, device())});
    r += n;
  }
  return runs;
}

void SequenceState::store_window_rows(int l, int64_t start, const TensorView& rows) {
  const LayerSpec& s = layout().spec(l);
  TERN_CHECK(rows.rank() == 2 && rows.dim(1) == s.kv_row_bytes, "store_window_rows: rows ", rows.shape().str(),
             " must be [n, ", s.kv_row_bytes, "]");
  const int64_t n = rows.dim(0);
  const TensorView ring_rows = ring(l);
  if (device() != Device::cpu || rows.device() != Device::cpu) {
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

}  // namespace tern::cache
