// Sequence state: layout, ring writes, snapshot / restore, serialize / deserialize and their errors.
#include <gtest/gtest.h>

#include <cstring>

#include "cache/sequence_state.h"
#include "test_util.h"

namespace tern {
namespace {

std::shared_ptr<const cache::StateLayout> small_layout(int64_t max_tokens = 64, int64_t tokens_per_page = 8) {
  std::vector<cache::LayerSpec> specs = {
      {4, 40, 0, 0, 0, 0},                    // SWA
      {4, 40, 4, 2 * 3 * 10, 24, 2 * 3 * 6},  // CSA
      {4, 40, 8, 3 * 10, 0, 0},               // HCA
  };
  return std::make_shared<const cache::StateLayout>(specs, max_tokens, tokens_per_page);
}

// The same layers with a wider HCA ring: another layout.
std::shared_ptr<const cache::StateLayout> other_layout() {
  std::vector<cache::LayerSpec> specs = {
      {4, 40, 0, 0, 0, 0}, {4, 40, 4, 2 * 3 * 10, 24, 2 * 3 * 6}, {8, 40, 8, 3 * 10, 0, 0}};
  return std::make_shared<const cache::StateLayout>(specs, 64, 8);
}

void scribble(cache::SequenceState& s, test::Random& rng, int64_t n) {
  // what a forward step of n tokens writes: ring rows, accumulators, new rows; then advance
  for (int l = 0; l < s.layout().num_layers(); ++l) {
    Tensor rows(DType::u8, {n, 40});
    for (int64_t i = 0; i < rows.numel(); ++i)
      rows.data<uint8_t>()[i] = static_cast<uint8_t>(rng.integer(1, 255));
    s.store_window_rows(l, s.position(), rows);
    const TensorView acc = s.compressor_acc(l);
    for (int64_t i = 0; i < acc.numel(); ++i) acc.data_as<float>()[i] = rng.normal();
    const int64_t from = s.layout().entries(l, s.position()), to = s.layout().entries(l, s.position() + n);
    for (bool keys : {false, true})
      if (from < to && (!keys || s.layout().spec(l).index_row_bytes > 0))
        for (const cache::RowRun& run : s.row_runs(l, keys, from, to))
          for (int64_t b = 0; b < run.rows.numel(); ++b) run.rows.data_as<uint8_t>()[b] = uint8_t(rng.integer(1, 255));
  }
  s.advance(n);
}

TEST(SequenceState, LayoutCountsFollowThePosition) {
  const auto layout = small_layout();
  EXPECT_EQ(layout->places(1).rows_per_page, 2);  // 8 tokens per page
  EXPECT_EQ(layout->places(2).rows_per_page, 1);
  EXPECT_EQ(layout->places(0).rows_per_page, 0);
  EXPECT_EQ(layout->entries(1, 7), 1);
  EXPECT_EQ(layout->entries(2, 7), 0);
  EXPECT_EQ(layout->entries(0, 7), 0);
  EXPECT_EQ(layout->row_pages_for(0), 0);
  EXPECT_EQ(layout->row_pages_for(8), 1);
  EXPECT_EQ(layout->row_pages_for(9), 2);
  // Row page: CSA 2 x 40 B rows (128 with alignment) + 2 x 24 B keys (64), HCA 1 x 40 B (64).
  EXPECT_EQ(layout->row_page_used_bytes(), 256);
  EXPECT_EQ(layout->page_bytes(), 256);
  EXPECT_EQ(layout->serialized_bytes(0), layout->fixed_bytes());
  EXPECT_EQ(layout->serialized_bytes(9), layout->fixed_bytes() + 2 * (40 + 24) + 1 * 40);
  cache::SequenceState s(layout);
  EXPECT_EQ(s.position(), 0);
  EXPECT_EQ(s.capacity(), 64);
  EXPECT_EQ(s.pages_held(), layout->pages_for(64));
  EXPECT_THROW(s.advance(65), Error);
}

TEST(SequenceState, RingKeepsTheLastWindowRows) {
  cache::SequenceState s(small_layout());
  Tensor rows(DType::u8, {7, 40});
  for (int64_t r = 0; r < 7; ++r) std::memset(rows.data<uint8_t>() + r * 40, int(r + 1), 40);
  s.store_window_rows(0, 5, rows);  // positions 5..11: 8, 9, 10, 11 remain at slots 0..3
  for (int64_t p = 8; p < 12; ++p) EXPECT_EQ(s.ring(0).data_as<uint8_t>()[(p % 4) * 40], uint8_t(p - 5 + 1));
}

TEST(SequenceState, SnapshotRestoreRollsBack) {
  test::Random rng(61);
  cache::SequenceState s(small_layout());
  scribble(s, rng, 13);
  const cache::Snapshot snap = s.snapshot();
  const std::vector<std::byte> before = s.serialize();
  scribble(s, rng, 5);
  scribble(s, rng, 1);
  EXPECT_EQ(s.position(), 19);
  s.restore(snap);
  EXPECT_EQ(s.position(), 13);
  EXPECT_EQ(s.serialize(), before);
  cache::SequenceState other(other_layout());
  EXPECT_THROW(other.restore(snap), Error);
  cache::SequenceState short_one(small_layout(8));  // same layout, but no room for position 13
  EXPECT_THROW(short_one.restore(snap), Error);
}

// A layer with a carry (the MTP layer's): snapshot_into a reserved slot restores it with the rest, and a slot too
// small is refused.
TEST(SequenceState, SnapshotIntoASlotKeepsTheCarry) {
  test::Random rng(63);
  std::vector<cache::LayerSpec> specs = {{4, 40, 4, 2 * 3 * 10, 24, 2 * 3 * 6}, {4, 40, 0, 0, 0, 0, 32}};
  const auto layout = std::make_shared<const cache::StateLayout>(specs, 64, 8);
  EXPECT_NE(layout->fingerprint(), small_layout()->fingerprint());
  cache::SequenceState s(layout);
  scribble(s, rng, 11);
  const TensorView carry = s.carry(1);
  ASSERT_EQ(carry.numel(), 32);
  for (int64_t i = 0; i < 32; ++i) carry.data_as<float>()[i] = rng.normal();
  const std::vector<std::byte> before = s.serialize();
  Tensor slot(DType::u8, {s.snapshot_bytes() + 64});
  const cache::Snapshot snap = s.snapshot_into(slot);
  EXPECT_TRUE(snap.fixed.empty());
  scribble(s, rng, 3);
  for (int64_t i = 0; i < 32; ++i) carry.data_as<float>()[i] = rng.normal();
  EXPECT_NE(s.serialize(), before);
  s.restore(snap);
  EXPECT_EQ(s.position(), 11);
  EXPECT_EQ(s.serialize(), before);  // the carry is one of the serialised fixed parts
  Tensor small(DType::u8, {s.snapshot_bytes() - 1});
  EXPECT_THROW((void)s.snapshot_into(small), Error);
}

TEST(SequenceState, SerializeRoundTripsAndChecksItsInput) {
  test::Random rng(62);
  cache::SequenceState s(small_layout());
  scribble(s, rng, 9);
  scribble(s, rng, 12);
  const std::vector<std::byte> bytes = s.serialize();
  cache::SequenceState copy(small_layout());
  copy.deserialize(bytes);
  EXPECT_EQ(copy.position(), 21);
  EXPECT_EQ(copy.serialize(), bytes);
  for (int l = 0; l < 3; ++l)
    for (int64_t r = 0; r < s.compressed_count(l); ++r)
      EXPECT_EQ(std::memcmp(s.compressed_rows(l).row(r), copy.compressed_rows(l).row(r), 40), 0);
  // Capacity and page size are not part of the format: a bigger state with other pages takes it.
  cache::SequenceState roomy(small_layout(512, 32));
  roomy.deserialize(bytes);
  EXPECT_EQ(roomy.serialize(), bytes);
  cache::SequenceState tight(std::make_shared<cache::PagePool>(small_layout(), 20), 8);
  EXPECT_THROW(tight.deserialize(bytes), Error);  // position 21 beyond its reserved pages
  EXPECT_EQ(tight.position(), 0);
  ASSERT_TRUE(tight.reserve(21));
  tight.deserialize(bytes);
  EXPECT_EQ(tight.serialize(), bytes);
  std::vector<std::byte> cut(bytes.begin(), bytes.end() - 1);
  EXPECT_THROW(copy.deserialize(cut), Error);
  std::vector<std::byte> bad = bytes;
  bad[0] = std::byte{0};
  EXPECT_THROW(copy.deserialize(bad), Error);
  cache::SequenceState other(other_layout());
  try {
    other.deserialize(bytes);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another model or state layout"), std::string::npos);
  }
}

}  // namespace
}  // namespace tern
