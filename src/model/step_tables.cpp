#include "model/step_tables.h"

#include <algorithm>

#include "core/error.h"

namespace tern::model {

int64_t table_address(const TensorView& v) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(v.data())); }

namespace {
constexpr int kGlobalWords = 5, kWordsPerLayer = 4;

bool same_layers(const cache::StateLayout& a, const cache::StateLayout& b) {
  bool same = a.num_layers() == b.num_layers();
  for (int l = 0; same && l < a.num_layers(); ++l) same = a.spec(l) == b.spec(l);
  return same;
}
}  // namespace

StepTables::StepTables(const cache::StateLayout& bound, Device device, int64_t slots, int64_t max_queries)
    : layout_(&bound), device_(device), slots_(slots), max_queries_(max_queries) {
  TERN_CHECK(slots >= 1, "step tables: ", slots, " slots");
  TERN_CHECK(max_queries >= 1 && max_queries <= kMaxQueries, "step tables: ", max_queries,
             " tokens a sequence (1 to ", kMaxQueries, ")");
}

int64_t StepTables::words(const cache::StateLayout& layout, int64_t slots) {
  return (kGlobalWords + kWordsPerLayer * static_cast<int64_t>(layout.num_layers())) * slots;
}

void StepTables::fill(std::span<int64_t> image, std::span<const StepSequence> batch, std::span<const int64_t> starts,
                      std::span<const int64_t> first_slots) const {
  TERN_CHECK(starts.empty() || starts.size() == batch.size(), "step tables: ", starts.size(), " starts for ",
             batch.size(), " sequences");
  TERN_CHECK(first_slots.empty() || first_slots.size() == batch.size(), "step tables: ", first_slots.size(),
             " first slots for ", batch.size(), " sequences");
  const int64_t S = slots_;
  int64_t tokens = 0;
  for (const StepSequence& s : batch) tokens += static_cast<int64_t>(s.tokens.size());
  TERN_CHECK(tokens <= S && static_cast<int64_t>(image.size()) >= words(), "step tables: ", tokens, " tokens in ", S,
             " slots, ", image.size(), " words");
  std::fill(image.begin(), image.begin() + words(), int64_t{0});
  for (int64_t i = 0; i < S; ++i) image[S + i] = -1, image[4 * S + i] = i;  // inert padding, each its own sequence
  int64_t i = 0;  // the next slot
  for (size_t k = 0; k < batch.size(); ++k) {
    const StepSequence& s = batch[k];
    const auto n = static_cast<int64_t>(s.tokens.size());
    TERN_CHECK(s.state != nullptr && n >= 1, "step tables: sequence ", k, " needs a state and a token");
    TERN_CHECK(n <= max_queries_, "step tables: sequence ", k, " brings ", n, " tokens, the tables take ",
               max_queries_, " a sequence");
    if (!first_slots.empty()) {
      i = first_slots[k];
      TERN_CHECK(i >= 0 && i + n <= S, "step tables: sequence ", k, "'s slots ", i, " .. ", i + n - 1,
                 " outside the ", S, " slots");
      for (int64_t j = i; j < i + n; ++j)
        TERN_CHECK(image[S + j] == -1, "step tables: sequence ", k, " takes slot ", j, ", which another has");
    }
    const cache::SequenceState& state = *s.state;
    TERN_CHECK(same_layers(state.layout(), *layout_),
               "forward: the state's layout does not belong to this model and KV mode");
    TERN_CHECK(state.device() == device_, "forward: the state is not on the model's device (make it with new_state())");
    const int64_t pos = starts.empty() ? state.position() : starts[k];
    TERN_CHECK(pos >= 0 && pos + n <= state.layout().max_tokens(), "forward: ", pos + n,
               " tokens exceed the state's capacity of ", state.layout().max_tokens());
    TERN_CHECK(state.capacity() >= pos + n, "step tables: sequence ", k, "'s state holds pages for ",
               state.capacity(), " positions, not ", pos + n, " (reserve() first)");
    const int64_t first = i;
    for (int64_t t = 0; t < n; ++t, ++i) {
      const int64_t p = pos + t;
      image[i] = s.tokens[static_cast<size_t>(t)];
      image[S + i] = p;
      image[4 * S + i] = first;
      for (int l = 0; l < layout_->num_layers(); ++l) {
        int64_t* w = image.data() + (kGlobalWords + kWordsPerLayer * l) * S + i;
        const cache::LayerSpec& spec = layout_->spec(l);
        w[0 * S] = table_address(state.ring(l));
        if (spec.ratio > 0) {
          const PagedRows rows = state.compressed_rows(l);  // every layer's rows: the same pool and table
          image[2 * S + i] = table_address(rows.pool);
          image[3 * S + i] = table_address(rows.block_table);
          w[1 * S] = table_address(state.compressor_acc(l));
          w[3 * S] = p / spec.ratio * spec.ratio;
        }
        if (spec.index_row_bytes > 0) w[2 * S] = table_address(state.indexer_acc(l));
      }
    }
  }
}

void StepTables::view(const TensorView& words) {
  const int64_t S = slots_;
  TERN_CHECK(words.dtype() == DType::i64 && words.numel() >= this->words(), "step tables: ", words.shape().str(),
             " holds fewer than ", this->words(), " words");
  TERN_CHECK(words.device() == device_, "step tables: their words are on another device than the states");
  auto array = [&](int64_t k) {
    return TensorView(words.data_as<int64_t>() + k * S, DType::i64, {S}, words.device());
  };
  ids_ = array(0), positions_ = array(1), pools_ = array(2), row_tables_ = array(3), firsts_ = array(4);
  layers_.clear();
  for (int64_t l = 0; l < layout_->num_layers(); ++l) {
    const int64_t k = kGlobalWords + kWordsPerLayer * l;
    layers_.push_back({array(k), array(k + 1), array(k + 2), array(k + 3)});
  }
}

int64_t StepPlan::max_queries() const {
  int64_t q = 1;
  for (const StepSequence& s : sequences) q = std::max(q, static_cast<int64_t>(s.tokens.size()));
  return q;
}

std::optional<StepTables> StepTables::build(const StepPlan& plan, Device device) {
  if (plan.empty()) return std::nullopt;
  StepTables t(*plan.bound, device, plan.slots, plan.max_queries());
  Tensor image(DType::i64, {t.words()});
  t.fill({image.data<int64_t>(), static_cast<size_t>(image.numel())}, plan.sequences, plan.starts, plan.first_slots);
  t.held_ = device == Device::cpu ? std::move(image) : Tensor::copy_of(image, device);
  t.view(t.held_);
  return t;
}

ops::StepPagedRows StepTables::paged_rows(int l, bool keys) const {
  const cache::StateLayout::LayerPlaces& pl = layout_->places(l);
  const cache::LayerSpec& spec = layout_->spec(l);
  ops::StepPagedRows r;
  r.pools = pools_;
  r.tables = row_tables_;
  r.page_bytes = layout_->page_bytes();
  r.offset_in_page = keys ? pl.index_keys_offset : pl.compressed_offset;
  r.rows_per_page = pl.rows_per_page;
  r.row_bytes = keys ? spec.index_row_bytes : spec.kv_row_bytes;
  return r;
}

}  // namespace tern::model
