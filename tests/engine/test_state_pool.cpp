// The engine's state pool over real pages: block tables, admission at startup, and the metrics.
#include <gtest/gtest.h>

#include <set>

#include "engine/engine.h"
#include "fake_runner.h"

namespace tern::engine {
namespace {

using testing::FakeRunner;

// FakeRunner's layout with 16 tokens per page: pages of 16 x 64 B, one fixed page per sequence.
std::shared_ptr<const cache::StateLayout> fake_layout() { return FakeRunner().state_layout(16); }

TEST(StatePool, BlockTablesTakeAndReturnWholePages) {
  StatePool pool(fake_layout(), 10 * 1024 + 1000, Device::cpu);
  EXPECT_EQ(pool.geometry().page_bytes, 1024);
  EXPECT_EQ(pool.total_pages(), 10);
  EXPECT_EQ(pool.total_bytes(), 10 * 1024);
  EXPECT_TRUE(pool.reserve(1, 40));  // 1 fixed + 3 row pages
  EXPECT_EQ(pool.pages_held(1), 4);
  EXPECT_EQ(pool.used_bytes(), 4 * 1024);
  EXPECT_TRUE(pool.reserve(1, 48));
  EXPECT_EQ(pool.pages_held(1), 4);
  EXPECT_EQ(pool.state(1).capacity(), 48);
  EXPECT_FALSE(pool.reserve(2, 100));  // 1 + 7 pages, 6 free: nothing taken
  EXPECT_EQ(pool.pages_held(2), 0);
  EXPECT_EQ(pool.live(), 1u);
  EXPECT_FALSE(pool.reserve(1, 49 + 6 * 16));  // growth beyond the free pages: no change
  EXPECT_EQ(pool.pages_held(1), 4);
  EXPECT_TRUE(pool.reserve(2, 1));
  const auto& a = pool.block_table(1);
  const auto& b = pool.block_table(2);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), a.size() + b.size());  // no page in two tables
  EXPECT_EQ(pool.free_pages(), 4);
  pool.release(1);
  pool.release(2);
  pool.release(3);  // holds nothing: nothing happens
  EXPECT_EQ(pool.free_pages(), 10);
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_THROW(pool.state(1), Error);
}

TEST(StatePool, ABudgetTooSmallForOneSequenceFailsAtStartup) {
  // One sequence of one token needs 2 pages of 1024 B.
  EXPECT_THROW(StatePool(fake_layout(), 2047, Device::cpu), Error);
  EXPECT_NO_THROW(StatePool(fake_layout(), 2048, Device::cpu));
  EngineOptions o;
  o.state_memory_bytes = 1500;
  o.tokens_per_page = 16;
  o.token_bytes = [](int32_t) { return std::string("x"); };
  try {
    Engine engine(std::make_shared<FakeRunner>(), o);
    FAIL() << "an engine without room for one sequence started";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("state memory of 1500 bytes cannot hold one sequence (2 pages of 1024 B = 2048 bytes needed)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("raise --state-memory"), std::string::npos) << m;
  }
}

TEST(StatePool, PagesPerTokenMustFitTheRatios) {
  // A layout with ratios 4 and 8 cannot have pages of 12 tokens (a row would straddle two pages).
  const std::vector<cache::LayerSpec> layers{{4, 40, 4, 0, 0, 0}, {4, 40, 8, 0, 0, 0}};
  try {
    cache::StateLayout(layers, 100, 12);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens per page 12 must be a positive multiple of every compression ratio (4, 8)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cache::StateLayout(layers, 100, 0).tokens_per_page(), 64);
}

TEST(StatePool, MetricsReportRealPages) {
  EngineOptions o;
  o.state_memory_bytes = 100 * 1024 + 5;
  o.tokens_per_page = 16;
  o.limits.token_budget = 64;
  o.limits.max_chunk = 32;
  o.token_bytes = [](int32_t) { return std::string("x"); };
  auto runner = std::make_shared<FakeRunner>();
  Engine engine(runner, o);
  EXPECT_EQ(engine.metrics().state_total_bytes, 100 * 1024);
  EXPECT_EQ(engine.metrics().state_used_bytes, 0);
  EXPECT_NE(engine.memory_plan().find("100 pages of 1024 B"), std::string::npos) << engine.memory_plan();
  for (uint64_t i = 0; i < 3; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 20 + 10 * static_cast<int>(i); ++t) r.prompt.push_back(t % 60);
    r.stop.max_tokens = 30;
    r.stop.ignore_eos = true;
    engine.submit(r, [](RequestUpdate&&) {});
  }
  for (int step = 0; step < 6; ++step) {
    engine.step();
    // Sequence ids are 1, 2, 3: what they hold is what the metrics and the pool say is used.
    int64_t held = 0;
    for (uint64_t id = 1; id <= 3; ++id) held += engine.pool().pages_held(id);
    EXPECT_GT(held, 0);
    EXPECT_EQ(engine.metrics().state_used_bytes, held * 1024);
    EXPECT_EQ(engine.pool().free_pages(), 100 - held);
  }
  while (!engine.idle()) engine.step();
  EXPECT_EQ(engine.metrics().state_used_bytes, 0);
  EXPECT_EQ(engine.pool().free_pages(), 100);
}

}  // namespace
}  // namespace tern::engine
