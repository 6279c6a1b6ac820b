// Where each part of one sequence's V4 state lives in fixed-size pages (see README.md).
//
// A sequence holds
//   fixed pages (fixed_pages() of them): per layer the sliding-window ring and the compressor and indexer
//     accumulators, packed first-fit so that no part straddles a page  -- rewritten as tokens arrive;
//   row pages, one per tokens_per_page() tokens of context: per layer the compressed rows and indexer keys
//     of those tokens (tokens_per_page / ratio of each)                   -- append-only.
// tokens_per_page is a multiple of every compression ratio, so every row page of a layer holds the same
// number of rows and a row never straddles two pages. The page size is the row page's size (or the largest
// fixed part, if larger), rounded up to 64 bytes. The position (tokens consumed) lives with the sequence,
// not in its pages; every count is a function of it.
//
// The cache knows bytes and row counts only; what a row or an accumulator means is the model's business
// (model/v4_model.cpp builds the LayerSpecs from the config and the KV mode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern::cache {

struct LayerSpec {
  int64_t window = 0;                 // ring rows
  int64_t kv_row_bytes = 0;           // bytes of one window row / compressed row
  int ratio = 0;                      // compression ratio; 0: no compressor
  int64_t compressor_acc_floats = 0;  // f32 accumulator state of the attention compressor
  int64_t index_row_bytes = 0;        // bytes of one indexer key; 0: no indexer
  int64_t indexer_acc_floats = 0;     // f32 accumulator state of the indexer's compressor
  // f32 the layer carries from the last consumed position to the next step: the MTP layer's copy of the trunk's
  // hidden streams of that position, which the next draft row reads (speculative decoding; 0: none). In the
  // state, so a snapshot, a preemption's recompute and a prefill-decode transfer all keep it with the window.
  int64_t carry_floats = 0;

  bool operator==(const LayerSpec&) const = default;
};

// A part of the fixed region: `bytes` at `offset` of the sequence's fixed page number `page`.
struct PagePlace {
  int64_t page = 0;
  int64_t offset = 0;
  int64_t bytes = 0;
};

class StateLayout {
 public:
  // max_tokens: the most positions one sequence may hold. tokens_per_page 0: the smallest multiple of every
  // compression ratio that is at least 64; otherwise it must be a positive multiple of every ratio.
  StateLayout(std::vector<LayerSpec> layers, int64_t max_tokens, int64_t tokens_per_page = 0);

  struct LayerPlaces {
    PagePlace ring, compressor_acc, indexer_acc, carry;  // in the fixed pages
    int64_t rows_per_page = 0;                    // compressed rows (= indexer keys) per row page; 0: none
    int64_t compressed_offset = 0;                // where they start in every row page
    int64_t index_keys_offset = 0;
  };

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerSpec& spec(int layer) const { return layers_.at(layer); }
  const LayerPlaces& places(int layer) const { return places_.at(layer); }
  int64_t max_tokens() const { return max_tokens_; }

  int64_t tokens_per_page() const { return tokens_per_page_; }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t fixed_pages() const { return fixed_pages_; }
  // Bytes of a row page that hold rows (the rest of the page, if any, is padding).
  int64_t row_page_used_bytes() const { return row_page_used_; }
  // Row pages / all pages a sequence of `tokens` positions needs.
  int64_t row_pages_for(int64_t tokens) const;
  int64_t pages_for(int64_t tokens) const { return fixed_pages_ + row_pages_for(tokens); }

  // serialize()'s sizes: the 64-byte header plus the fixed parts (no padding), and that plus the used rows.
  size_t fixed_bytes() const { return fixed_bytes_; }
  size_t serialized_bytes(int64_t position) const;
  // Identifies the layer specs: states move only between equal ones (capacity and page size may differ for
  // serialize(); export_pages() also needs equal page geometry).
  uint64_t fingerprint() const { return fingerprint_; }
  // Compressed rows of `layer` after `position` tokens.
  int64_t entries(int layer, int64_t position) const;

 private:
  std::vector<LayerSpec> layers_;
  std::vector<LayerPlaces> places_;
  int64_t max_tokens_ = 0, tokens_per_page_ = 0, page_bytes_ = 0, fixed_pages_ = 0, row_page_used_ = 0;
  size_t fixed_bytes_ = 0;
  uint64_t fingerprint_ = 0;
};

}  // namespace tern::cache
