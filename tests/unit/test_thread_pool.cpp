#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tern {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  set_thread_count(3);
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(0, 1000, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[i]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  set_thread_count(0);
}

TEST(ThreadPool, NestedCallsRunInlineAndErrorsPropagate) {
  set_thread_count(2);
  std::atomic<int64_t> sum{0};
  parallel_for(0, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      parallel_for(0, 10, [&](int64_t a, int64_t b) { sum += b - a; });
  });
  EXPECT_EQ(sum.load(), 40);
  EXPECT_THROW(parallel_for(0, 8, [](int64_t, int64_t) { fail("boom"); }), Error);
  set_thread_count(0);
}

}  // namespace
}  // namespace tern
