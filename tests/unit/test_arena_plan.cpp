// core/arena_plan.h: the recorded steps' arena plan (reuse of freed blocks within a step, frees deferred while a side
// branch is pending), against a brute-force model of which bytes are live.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "core/arena_plan.h"
#include "core/error.h"

namespace tern {
namespace {

TEST(ArenaPlan, ReusesFreedBlocksFirstFit) {
  ArenaPlan p;
  p.reset();
  const size_t a = p.allocate(1000), b = p.allocate(256), c = p.allocate(5000);
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1024u);  // 1000 rounded up to 256s
  EXPECT_EQ(c, 1280u);
  EXPECT_TRUE(p.last_fresh());
  p.release(a);
  const size_t d = p.allocate(512);  // into a's block
  EXPECT_EQ(d, 0u);
  EXPECT_FALSE(p.last_fresh());
  const size_t e = p.allocate(512);  // the rest of a's block
  EXPECT_EQ(e, 512u);
  EXPECT_EQ(p.allocate(256), 1280u + 5120u);  // nothing free below: at the top
  EXPECT_EQ(p.peak(), 1280u + 5120u + 256u);
  p.release(c);  // in the middle: a hole
  EXPECT_EQ(p.allocate(4096), 1280u);
  EXPECT_EQ(p.peak(), 1280u + 5120u + 256u);  // no growth
  EXPECT_EQ(p.allocate(0), 1280u + 4096u);    // an empty tensor still takes a block
}

TEST(ArenaPlan, TheTopComesDownAndCoalesces) {
  ArenaPlan p;
  p.reset();
  const size_t a = p.allocate(256), b = p.allocate(256), c = p.allocate(256);
  p.release(b);
  p.release(c);  // b and c merge, and reach the top: the top comes down to b
  EXPECT_EQ(p.allocate(768), b);  // grows from b
  EXPECT_EQ(p.peak(), 256u * 4);
  p.release(a);
  EXPECT_EQ(p.allocate(256), a);
}

TEST(ArenaPlan, FreesWaitForThePendingBranchesJoin) {
  ArenaPlan p;
  p.reset();
  const size_t before = p.allocate(1024);
  p.release(before);  // freed before the branch: reusable inside it
  p.branch_begin();
  const size_t side = p.allocate(1024);
  EXPECT_EQ(side, before);
  const size_t main = p.allocate(1024);
  p.release(main);  // freed while the branch is pending: not reused until the join
  EXPECT_NE(p.allocate(1024), main);
  p.branch_join();
  EXPECT_EQ(p.allocate(1024), main);
}

TEST(ArenaPlan, RefusesUnknownBlocks) {
  ArenaPlan p;
  p.reset();
  const size_t a = p.allocate(100);
  p.release(a);
  EXPECT_THROW(p.release(a), Error);
  EXPECT_THROW(p.release(12345), Error);
}

// Random allocations and frees with branches: no two live blocks overlap, a block freed during a pending branch is
// not handed out again before the join, the same calls give the same offsets, and the peak is what was used.
TEST(ArenaPlan, RandomSequencesNeverOverlap) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::vector<size_t> offsets[2];
    for (int run = 0; run < 2; ++run) {
      std::mt19937_64 rng(seed);
      ArenaPlan p;
      p.reset();
      std::map<size_t, size_t> live;       // offset -> bytes (rounded)
      std::vector<std::pair<size_t, size_t>> quarantined;  // freed during the pending branch
      bool pending = false;
      size_t high = 0;
      for (int step = 0; step < 400; ++step) {
        const int what = static_cast<int>(rng() % 10);
        if (what < 5 || live.empty()) {
          const size_t bytes = 1 + rng() % 20000, rounded = (bytes + 255) / 256 * 256;
          const size_t at = p.allocate(bytes);
          offsets[run].push_back(at);
          for (const auto& [o, b] : live) ASSERT_TRUE(at + rounded <= o || o + b <= at) << "overlap, seed " << seed;
          for (const auto& [o, b] : quarantined)
            ASSERT_TRUE(at + rounded <= o || o + b <= at) << "reused before the join, seed " << seed;
          live[at] = rounded;
          high = std::max(high, at + rounded);
        } else if (what < 8) {
          auto it = live.begin();
          std::advance(it, static_cast<long>(rng() % live.size()));
          p.release(it->first);
          if (pending) quarantined.push_back(*it);
          live.erase(it);
        } else if (!pending) {
          p.branch_begin();
          pending = true;
        } else {
          p.branch_join();
          pending = false;
          quarantined.clear();
        }
      }
      EXPECT_EQ(p.peak(), high) << "seed " << seed;
    }
    EXPECT_EQ(offsets[0], offsets[1]) << "seed " << seed << ": not deterministic";
  }
}

}  // namespace
}  // namespace tern
