#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "fake_runner.h"

namespace tern::engine {
namespace {

using testing::FakeRunner;

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  int64_t completion_tokens = 0;
  int updates = 0;
};

EngineOptions options(int64_t memory = int64_t{1} << 24) {
  EngineOptions o;
  o.state_memory_bytes = memory;
  o.tokens_per_page = 16;
  o.limits.token_budget = 64;
  o.limits.max_chunk = 32;
  o.limits.max_running = 16;
  o.eos_token_ids = {};
  o.token_bytes = [](int32_t t) { return std::string(1, static_cast<char>('A' + t % 26)); };
  return o;
}

class EngineTest : public ::testing::Test {
 protected:
  void make(EngineOptions o = options()) {
    runner = std::make_shared<FakeRunner>();
    engine = std::make_unique<Engine>(runner, std::move(o));
  }
  uint64_t submit(std::vector<int32_t> prompt, int64_t max_tokens, float temperature = 0, uint64_t seed = 1) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.stop.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return submit(std::move(r));
  }
  uint64_t submit(GenerationRequest r) {
    const size_t slot = out.size();
    out.emplace_back();
    return engine->submit(std::move(r), [this, slot](RequestUpdate&& u) {
      auto& c = out[slot];
      for (const auto& t : u.tokens) c.tokens.push_back(t.token);
      c.text += u.text;
      c.finish = u.finish;
      c.completion_tokens = u.completion_tokens;
      c.updates++;
    });
  }
  void run_to_end() {
    for (int i = 0; i < 100000 && !engine->idle(); ++i) engine->step();
    ASSERT_TRUE(engine->idle());
  }
  std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13) % 64);
    return p;
  }

  std::shared_ptr<FakeRunner> runner;
  std::unique_ptr<Engine> engine;
  std::deque<Collected> out;
};

TEST_F(EngineTest, GeneratesMaxTokensAndFreesState) {
  make();
  submit(prompt(100, 1), 10);
  run_to_end();
  EXPECT_EQ(out[0].tokens.size(), 10u);
  EXPECT_EQ(out[0].text.size(), 10u);
  EXPECT_EQ(out[0].finish, FinishReason::length);
  EXPECT_EQ(engine->pool().live(), 0u);
  EXPECT_EQ(engine->pool().used_bytes(), 0);
  const auto m = engine->metrics();
  EXPECT_EQ(m.generation_tokens_total, 10u);
  EXPECT_EQ(m.prompt_tokens_total, 100u);
  EXPECT_EQ(m.time_to_first_token_seconds.count(), 1u);
  EXPECT_EQ(m.inter_token_latency_seconds.count(), 9u);
}

// Greedy and seeded outputs do not depend on what else is in the batch, nor on preemption.
TEST_F(EngineTest, OutputDoesNotDependOnTheBatch) {
  std::vector<std::vector<int32_t>> alone;
  make();
  for (int i = 0; i < 24; ++i) {
    submit(prompt(10 + i * 9, i), 20, i % 2 ? 0.8f : 0.0f, 100 + i);
    run_to_end();
    alone.push_back(out.back().tokens);
  }
  for (int64_t memory : {int64_t{1} << 24, int64_t{40} << 10}) {  // the second forces preemptions
    make(options(memory));
    out.clear();
    for (int i = 0; i < 24; ++i) submit(prompt(10 + i * 9, i), 20, i % 2 ? 0.8f : 0.0f, 100 + i);
    run_to_end();
    for (int i = 0; i < 24; ++i) EXPECT_EQ(out[i].tokens, alone[i]) << "request " << i << " memory " << memory;
    EXPECT_EQ(engine->pool().live(), 0u);
    if (memory < (int64_t{1} << 20)) EXPECT_GT(engine->metrics().preemptions_total, 0u);
  }
}

TEST_F(EngineTest, AbortFreesStateWithinOneStep) {
  make();
  const uint64_t a = submit(prompt(50, 1), 1000);
  submit(prompt(50, 2), 5);
  engine->step();
  engine->step();
  EXPECT_EQ(engine->pool().live(), 2u);
  engine->abort(a);
  engine->step();
  EXPECT_EQ(out[0].finish, FinishReason::abort);
  EXPECT_EQ(engine->pool().live(), 1u);
  run_to_end();
  EXPECT_EQ(out[1].finish, FinishReason::length);
  EXPECT_EQ(engine->pool().used_bytes(), 0);
}

TEST_F(EngineTest, StopStringsStopTokensAndEos) {
  make();
  submit(prompt(20, 3), 30);
  run_to_end();
  const std::string full = out[0].text;
  ASSERT_EQ(full.size(), 30u);
  // Stop at the text of tokens 5..6; the output is everything before it.
  GenerationRequest r;
  r.prompt = prompt(20, 3);
  r.sampling.temperature = 0;
  r.stop.max_tokens = 30;
  r.stop.stop = {full.substr(5, 2)};
  submit(r);
  run_to_end();
  EXPECT_EQ(out[1].text, full.substr(0, full.find(full.substr(5, 2))));
  EXPECT_EQ(out[1].finish, FinishReason::stop);
  r.stop.stop = {};
  r.stop.stop_token_ids = {out[0].tokens[3]};
  submit(r);
  run_to_end();
  EXPECT_EQ(out[2].finish, FinishReason::stop);
  // The stop token is delivered (its logprob) and counted, but adds no text.
  ASSERT_LE(out[2].tokens.size(), 4u);
  EXPECT_EQ(out[2].tokens.back(), out[0].tokens[3]);
  EXPECT_EQ(out[2].completion_tokens, static_cast<int64_t>(out[2].tokens.size()));
  EXPECT_EQ(out[2].text, full.substr(0, out[2].tokens.size() - 1));
}

TEST_F(EngineTest, EosEndsUnlessIgnored) {
  make();
  submit(prompt(20, 4), 30);
  run_to_end();
  auto o = options();
  o.eos_token_ids = {out[0].tokens[2]};
  make(o);
  GenerationRequest r;
  r.prompt = prompt(20, 4);
  r.sampling.temperature = 0;
  r.stop.max_tokens = 30;
  submit(r);
  r.stop.ignore_eos = true;
  submit(r);
  run_to_end();
  EXPECT_EQ(out[1].finish, FinishReason::stop);
  EXPECT_EQ(out[2].tokens, out[0].tokens);
}

TEST_F(EngineTest, RejectsWhatCanNeverRun) {
  make(options(64 << 10));
  EXPECT_THROW(submit({}, 5), Error);
  EXPECT_THROW(submit({1, 2, 999}, 5), Error);
  EXPECT_THROW(submit(prompt(5000, 1), 5), Error);  // beyond the context
  EXPECT_THROW(submit(prompt(2000, 1), 5), Error);  // beyond the state memory
  EXPECT_THROW(submit(prompt(5, 1), 0), Error);
}

TEST_F(EngineTest, ThreadedLoopServesConcurrentSubmits) {
  make();
  engine->start();
  std::atomic<int> done{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      GenerationRequest r;
      r.prompt = prompt(30, i);
      r.stop.max_tokens = 15;
      engine->submit(r, [&](RequestUpdate&& u) {
        if (u.finish != FinishReason::none) done++;
      });
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 2000 && done < 8; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(done.load(), 8);
  engine->stop();
  EXPECT_EQ(engine->pool().live(), 0u);
}

}  // namespace
}  // namespace tern::engine
