#include "cache/state_layout.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "cache/state_header.h"
#include "core/error.h"

namespace tern::cache {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kMinTokensPerPage = 64;

int64_t align_up(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

uint64_t fnv1a(uint64_t h, int64_t value) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint64_t>(value >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

StateLayout::StateLayout(std::vector<LayerSpec> layers, int64_t max_tokens, int64_t tokens_per_page)
    : layers_(std::move(layers)), max_tokens_(max_tokens) {
  TERN_CHECK(max_tokens > 0, "state layout: max_tokens must be positive, found ", max_tokens);
  TERN_CHECK(!layers_.empty(), "state layout: no layers");
  uint64_t h = 0xcbf29ce484222325ull;
  int64_t lcm = 1, largest_fixed = 0;
  std::string ratios;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    TERN_CHECK(s.window > 0 && s.kv_row_bytes > 0 && s.ratio >= 0 && s.compressor_acc_floats >= 0 &&
                   s.index_row_bytes >= 0 && s.indexer_acc_floats >= 0 && s.carry_floats >= 0,
               "state layout: layer ", l, " needs a positive window and row size and no negative sizes");
    TERN_CHECK(s.ratio > 0 || s.index_row_bytes == 0, "state layout: layer ", l, " has indexer keys but no ratio");
    if (s.ratio > 0) {
      lcm = std::lcm(lcm, static_cast<int64_t>(s.ratio));
      ratios += (ratios.empty() ? "" : ", ") + std::to_string(s.ratio);
    }
    largest_fixed = std::max({largest_fixed, s.window * s.kv_row_bytes,
                              s.compressor_acc_floats * static_cast<int64_t>(sizeof(float)),
                              s.indexer_acc_floats * static_cast<int64_t>(sizeof(float)),
                              s.carry_floats * static_cast<int64_t>(sizeof(float))});
    for (int64_t v : {s.window, s.kv_row_bytes, static_cast<int64_t>(s.ratio), s.compressor_acc_floats,
                      s.index_row_bytes, s.indexer_acc_floats, s.carry_floats})
      h = fnv1a(h, v);
  }
  fingerprint_ = h;
  if (tokens_per_page == 0) tokens_per_page = (kMinTokensPerPage + lcm - 1) / lcm * lcm;
  TERN_CHECK(tokens_per_page > 0 && tokens_per_page % lcm == 0, "state layout: tokens per page ",
             tokens_per_page, " must be a positive multiple of every compression ratio (", ratios, ")");
  tokens_per_page_ = tokens_per_page;

  // Row page: per layer its compressed rows, then its indexer keys.
  places_.resize(layers_.size());
  int64_t cursor = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    if (s.ratio == 0) continue;
    LayerPlaces& p = places_[l];
    p.rows_per_page = tokens_per_page_ / s.ratio;
    p.compressed_offset = cursor;
    cursor = align_up(cursor + p.rows_per_page * s.kv_row_bytes);
    p.index_keys_offset = cursor;
    cursor = align_up(cursor + p.rows_per_page * s.index_row_bytes);
  }
  row_page_used_ = cursor;
  page_bytes_ = align_up(std::max(row_page_used_, largest_fixed));

  // Fixed pages: the parts in order, each in the first page with room (so small accumulators fill the gaps
  // the rings leave), none straddling a page.
  std::vector<int64_t> used;  // bytes taken in each fixed page
  auto place = [&](int64_t bytes) {
    size_t page = 0;
    while (page < used.size() && used[page] + bytes > page_bytes_) ++page;
    if (page == used.size()) used.push_back(0);
    const PagePlace at{static_cast<int64_t>(page), used[page], bytes};
    used[page] = align_up(used[page] + bytes);
    fixed_bytes_ += static_cast<size_t>(bytes);
    return at;
  };
  fixed_bytes_ = detail::kHeaderBytes;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerSpec& s = layers_[l];
    places_[l].ring = place(s.window * s.kv_row_bytes);
    places_[l].compressor_acc = place(s.compressor_acc_floats * static_cast<int64_t>(sizeof(float)));
    places_[l].indexer_acc = place(s.indexer_acc_floats * static_cast<int64_t>(sizeof(float)));
    places_[l].carry = place(s.carry_floats * static_cast<int64_t>(sizeof(float)));
  }
  fixed_pages_ = static_cast<int64_t>(used.size());
}

int64_t StateLayout::row_pages_for(int64_t tokens) const {
  if (row_page_used_ == 0 || tokens <= 0) return 0;
  return (tokens + tokens_per_page_ - 1) / tokens_per_page_;
}

size_t StateLayout::serialized_bytes(int64_t position) const {
  size_t n = fixed_bytes_;
  for (int l = 0; l < num_layers(); ++l)
    n += static_cast<size_t>(entries(l, position) * (spec(l).kv_row_bytes + spec(l).index_row_bytes));
  return n;
}

int64_t StateLayout::entries(int layer, int64_t position) const {
  const int ratio = spec(layer).ratio;
  return ratio > 0 ? position / ratio : 0;
}

}  // namespace tern::cache
