// The state pool's pages: no fragmentation under random interleaved use, sequences growing across many
// pages, and page-wise export / import between pools.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "cache/sequence_state.h"
#include "test_util.h"

namespace tern {
namespace {

// SWA, CSA (ratio 4, with indexer keys) and HCA (ratio 8) layers; 8 tokens per page.
std::shared_ptr<const cache::StateLayout> layout(int64_t tokens_per_page = 8, int64_t max_tokens = 4096) {
  std::vector<cache::LayerSpec> specs = {
      {4, 40, 0, 0, 0, 0}, {4, 40, 4, 2 * 3 * 10, 24, 2 * 3 * 6}, {4, 40, 8, 3 * 10, 0, 0}};
  return std::make_shared<const cache::StateLayout>(specs, max_tokens, tokens_per_page);
}

// A byte that names (sequence, layer, kind, row): what `fill` writes and `expect_rows` checks.
uint8_t tag(int seq, int layer, bool keys, int64_t row) {
  return static_cast<uint8_t>(seq * 31 + layer * 7 + (keys ? 101 : 0) + row * 13);
}

void fill(cache::SequenceState& s, int seq, int64_t from_token, int64_t to_token) {
  for (int l = 0; l < s.layout().num_layers(); ++l)
    for (bool keys : {false, true}) {
      const int64_t a = s.layout().entries(l, from_token), b = s.layout().entries(l, to_token);
      if (a == b || (keys && s.layout().spec(l).index_row_bytes == 0)) continue;
      for (const cache::RowRun& run : s.row_runs(l, keys, a, b))
        for (int64_t r = 0; r < run.rows.dim(0); ++r)
          std::memset(run.rows.data_as<std::byte>() + r * run.rows.dim(1), tag(seq, l, keys, a + run.first + r),
                      static_cast<size_t>(run.rows.dim(1)));
    }
  std::memset(s.compressor_acc(1).data(), seq + 1, s.compressor_acc(1).nbytes());
}

// Every row written so far still holds its tag (read through the paged view the ops get).
void expect_rows(const cache::SequenceState& s, int seq, int64_t tokens) {
  for (int l = 0; l < s.layout().num_layers(); ++l)
    for (bool keys : {false, true}) {
      const PagedRows p = keys ? s.index_keys(l) : s.compressed_rows(l);
      if (p.empty() || p.row_bytes == 0) continue;
      for (int64_t r = 0; r < s.layout().entries(l, tokens); ++r)
        for (int64_t b = 0; b < p.row_bytes; ++b)
          ASSERT_EQ(static_cast<uint8_t>(p.row(r)[b]), tag(seq, l, keys, r))
              << "seq " << seq << " layer " << l << " keys " << keys << " row " << r;
    }
  ASSERT_EQ(static_cast<uint8_t>(s.compressor_acc(1).data_as<std::byte>()[0]), static_cast<uint8_t>(seq + 1));
}

TEST(PagePool, NeverFragmentsUnderRandomUse) {
  auto pool = std::make_shared<cache::PagePool>(layout(), 300);
  const cache::StateLayout& L = pool->layout();
  test::Random rng(71);
  std::map<int, cache::SequenceState> live;
  std::map<int, int64_t> tokens;
  int next = 0;
  int64_t grown = 0, refused = 0;
  for (int op = 0; op < 4000; ++op) {
    const int64_t kind = rng.integer(0, 9);
    if (kind < 3 || live.empty()) {  // admit a sequence of 1 .. 100 tokens
      const int64_t t = rng.integer(1, 100), need = L.pages_for(t);
      if (need > pool->free_pages()) {
        EXPECT_THROW(cache::SequenceState(pool, t), Error);
        ++refused;
        continue;
      }
      cache::SequenceState s(pool, t);  // must succeed whenever the pages are free, whoever freed them
      fill(s, next, 0, t);
      s.advance(t);
      tokens[next] = t;
      live.emplace(next++, std::move(s));
    } else {
      auto it = live.begin();
      std::advance(it, rng.integer(0, static_cast<int64_t>(live.size()) - 1));
      cache::SequenceState& s = it->second;
      if (kind < 7) {  // grow by 1 .. 40 tokens
        const int64_t t = tokens[it->first], more = rng.integer(1, 40);
        const int64_t need = L.pages_for(t + more) - s.pages_held(), free_before = pool->free_pages();
        const bool ok = s.reserve(t + more);
        EXPECT_EQ(ok, need <= free_before);
        if (!ok) {
          EXPECT_EQ(pool->free_pages(), free_before);
          ++refused;
          continue;
        }
        fill(s, it->first, t, t + more);
        s.advance(more);
        tokens[it->first] = t + more;
        ++grown;
      } else {  // finish it
        expect_rows(s, it->first, tokens[it->first]);
        tokens.erase(it->first);
        live.erase(it);
      }
    }
    // Invariants: the block tables are disjoint, hold exactly the used pages, and match the tokens.
    std::set<int32_t> pages;
    int64_t held = 0;
    for (const auto& [id, s] : live) {
      EXPECT_EQ(s.pages_held(), L.pages_for(tokens[id]));
      pages.insert(s.block_table().begin(), s.block_table().end());
      held += s.pages_held();
    }
    ASSERT_EQ(static_cast<int64_t>(pages.size()), held);
    ASSERT_EQ(pool->used_pages(), held);
  }
  for (const auto& [id, s] : live) expect_rows(s, id, tokens[id]);
  EXPECT_GT(grown, 500);
  EXPECT_GT(refused, 10);  // the pool did run full
  live.clear();
  EXPECT_EQ(pool->free_pages(), 300);
  // Nothing is stranded: one sequence can take every page.
  const int64_t all = (300 - L.fixed_pages()) * L.tokens_per_page();
  cache::SequenceState whole(pool, all);
  EXPECT_EQ(pool->free_pages(), 0);
  EXPECT_FALSE(whole.reserve(all + 1));
}

TEST(PagePool, ReturnsOnlyPagesInUse) {
  auto pool = std::make_shared<cache::PagePool>(layout(), 4);
  std::vector<int32_t> t;
  ASSERT_TRUE(pool->take(2, t));
  EXPECT_FALSE(pool->take(3, t));
  EXPECT_EQ(t.size(), 2u);
  const std::vector<int32_t> twice{t[0], t[0]};
  EXPECT_THROW(pool->give_back(twice), Error);
  EXPECT_THROW(pool->give_back(std::vector<int32_t>{t[0], 7}), Error);
  EXPECT_EQ(pool->free_pages(), 2);  // a refused return changes nothing
  pool->give_back(t);
  EXPECT_EQ(pool->free_pages(), 4);
  EXPECT_THROW(pool->give_back(t), Error);
  EXPECT_THROW(cache::PagePool(layout(), 0), Error);
}

TEST(SequenceState, GrowsAcrossManyPages) {
  // One token at a time to 500 tokens (63 row pages), interleaved with a second sequence so that the
  // pages of each are scattered through the pool.
  auto pool = std::make_shared<cache::PagePool>(layout(), 200);
  cache::SequenceState a(pool), b(pool);
  EXPECT_EQ(a.capacity(), 0);
  EXPECT_THROW(a.advance(1), Error);  // no row page yet
  for (int64_t t = 0; t < 500; ++t) {
    for (auto [s, id] : {std::pair{&a, 1}, std::pair{&b, 2}}) {
      ASSERT_TRUE(s->reserve(t + 1));
      fill(*s, id, t, t + 1);
      s->advance(1);
    }
  }
  EXPECT_EQ(a.pages_held(), a.layout().fixed_pages() + 63);
  expect_rows(a, 1, 500);
  expect_rows(b, 2, 500);
  bool scattered = false;
  for (size_t i = 1; i < a.block_table().size(); ++i) scattered |= a.block_table()[i] != a.block_table()[i - 1] + 1;
  EXPECT_TRUE(scattered);
  // A snapshot rolls back across pages appended after it.
  const cache::Snapshot snap = a.snapshot();
  const std::vector<std::byte> before = a.serialize();
  ASSERT_TRUE(a.reserve(540));
  fill(a, 9, 500, 540);
  a.advance(40);
  a.restore(snap);
  EXPECT_EQ(a.serialize(), before);
}

TEST(SequenceState, ExportsAndImportsWholePages) {
  auto src_pool = std::make_shared<cache::PagePool>(layout(), 100);
  cache::SequenceState filler(src_pool, 30);  // so that the source's pages do not start at 0
  cache::SequenceState src(src_pool, 77);
  fill(src, 5, 0, 77);
  src.advance(77);
  const std::vector<std::byte> pages = src.export_pages();
  EXPECT_EQ(src.pages_used(), src.layout().pages_for(77));
  EXPECT_EQ(pages.size(), 64 + static_cast<size_t>(src.pages_used() * src.layout().page_bytes()));

  auto dst_pool = std::make_shared<cache::PagePool>(layout(), 100);
  cache::SequenceState other(dst_pool, 50);
  cache::SequenceState dst(dst_pool, 40);  // reserved too little
  EXPECT_THROW(dst.import_pages(pages), Error);
  EXPECT_EQ(dst.position(), 0);
  ASSERT_TRUE(dst.reserve(77));
  std::vector<std::byte> cut(pages.begin(), pages.end() - 1);
  EXPECT_THROW(dst.import_pages(cut), Error);
  dst.import_pages(pages);
  EXPECT_EQ(dst.position(), 77);
  EXPECT_EQ(dst.serialize(), src.serialize());
  expect_rows(dst, 5, 77);

  // Page-wise, as a transfer does it: header, then page(i) by page(i).
  cache::SequenceState dst2(dst_pool, 77);
  for (int64_t i = 0; i < src.pages_used(); ++i) copy_view(src.page(i), dst2.page(i));
  dst2.import_header(src.export_header());
  EXPECT_EQ(dst2.serialize(), src.serialize());

  // Another page geometry cannot take the pages (serialize() still moves the state).
  cache::SequenceState wide(std::make_shared<cache::PagePool>(layout(16), 100), 77);
  try {
    wide.import_pages(pages);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pages of"), std::string::npos) << e.what();
  }
  EXPECT_EQ(wide.position(), 0);
  wide.deserialize(src.serialize());
  expect_rows(wide, 5, 77);
}

}  // namespace
}  // namespace tern
