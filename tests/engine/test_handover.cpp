// Prefill-decode disaggregation inside the engine: a prefill engine hands a request's state and first
// token over (GenerationRequest::handover), a decode engine continues it (submit_remote +
// provide_state), and the output equals one engine running the whole request.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "fake_runner.h"

namespace tern::engine {
namespace {

using testing::FakeRunner;

EngineOptions options(int64_t memory = int64_t{1} << 24) {
  EngineOptions o;
  o.state_memory_bytes = memory;
  o.tokens_per_page = 16;
  o.limits.token_budget = 64;
  o.limits.max_chunk = 32;
  o.limits.max_running = 16;
  o.token_bytes = [](int32_t t) { return std::string(1, static_cast<char>('A' + t % 26)); };
  return o;
}

struct Out {
  std::vector<GeneratedToken> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  std::string error;
  int64_t completion_tokens = 0;
  std::shared_ptr<const Handover> handover;
};

UpdateSink collect(Out& o) {
  return [&o](RequestUpdate&& u) {
    for (auto& t : u.tokens) o.tokens.push_back(t);
    o.text += u.text;
    if (u.finish != FinishReason::none) {
      o.finish = u.finish;
      o.error = u.error;
      o.completion_tokens = u.completion_tokens;
      o.handover = u.handover;
    }
  };
}

void run(Engine& e) {
  for (int i = 0; i < 100000 && !e.idle(); ++i) e.step();
  ASSERT_TRUE(e.idle());
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13) % 64);
  return p;
}

GenerationRequest request(int n, int salt, int64_t max_tokens, float temperature) {
  GenerationRequest r;
  r.prompt = prompt(n, salt);
  r.stop.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = 1000 + salt;
  r.sampling.top_logprobs = 2;
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.repetition_penalty = 1.2f;
  return r;
}

// Runs `r` on a prefill engine and a decode engine; returns the decode side's output.
Out disaggregated(const GenerationRequest& r, Engine& prefill, Engine& decode) {
  Out p, d;
  GenerationRequest pr = r;
  pr.handover = true;
  prefill.submit(pr, collect(p));
  run(prefill);
  EXPECT_EQ(p.finish, FinishReason::handover);
  EXPECT_TRUE(p.tokens.empty());
  if (!p.handover) return d;
  bool reserved = false;
  const uint64_t id = decode.submit_remote(r, collect(d), [&] { reserved = true; });
  decode.step();
  EXPECT_TRUE(reserved);
  EXPECT_EQ(decode.metrics().num_transferring, 1);
  EXPECT_GT(decode.pool().used_bytes(), 0);
  EXPECT_EQ(decode.pool().live(), 1u);
  std::string import_error = "not called";
  decode.provide_state(id, p.handover, [&](std::string e) { import_error = std::move(e); });
  run(decode);
  EXPECT_EQ(import_error, "");
  EXPECT_EQ(decode.metrics().num_transferring, 0);
  return d;
}

TEST(Handover, OutputEqualsOneEngine) {
  auto one_runner = std::make_shared<FakeRunner>();
  Engine one(one_runner, options());
  auto p_runner = std::make_shared<FakeRunner>();
  auto d_runner = std::make_shared<FakeRunner>();
  Engine prefill(p_runner, options());
  Engine decode(d_runner, options());
  for (int i = 0; i < 12; ++i) {
    const GenerationRequest r = request(1 + i * 11, i, i == 3 ? 1 : 12, i % 2 ? 0.9f : 0.0f);
    Out alone;
    one.submit(r, collect(alone));
    run(one);
    const Out d = disaggregated(r, prefill, decode);
    ASSERT_EQ(d.tokens.size(), alone.tokens.size()) << "request " << i;
    for (size_t k = 0; k < d.tokens.size(); ++k) {
      EXPECT_EQ(d.tokens[k].token, alone.tokens[k].token) << "request " << i << " token " << k;
      EXPECT_EQ(d.tokens[k].logprob, alone.tokens[k].logprob);
      ASSERT_EQ(d.tokens[k].top.size(), alone.tokens[k].top.size());
    }
    EXPECT_EQ(d.text, alone.text);
    EXPECT_EQ(d.finish, alone.finish);
    EXPECT_EQ(d.completion_tokens, alone.completion_tokens);
  }
  EXPECT_EQ(prefill.pool().live(), 0u);
  EXPECT_EQ(decode.pool().live(), 0u);
  EXPECT_EQ(prefill.pool().used_bytes(), 0);
  EXPECT_EQ(decode.pool().used_bytes(), 0);
  EXPECT_EQ(prefill.metrics().finished_total[static_cast<size_t>(FinishReason::handover)], 12u);
}

// A stop string that the first token completes ends the request on the decode side at once.
TEST(Handover, FirstTokenCanFinishTheRequest) {
  auto one_runner = std::make_shared<FakeRunner>();
  Engine one(one_runner, options());
  GenerationRequest r = request(9, 5, 10, 0.0f);
  Out alone;
  one.submit(r, collect(alone));
  run(one);
  ASSERT_FALSE(alone.text.empty());
  r.stop.stop = {alone.text.substr(0, 1)};
  auto p_runner = std::make_shared<FakeRunner>();
  auto d_runner = std::make_shared<FakeRunner>();
  Engine prefill(p_runner, options());
  Engine decode(d_runner, options());
  const Out d = disaggregated(r, prefill, decode);
  EXPECT_EQ(d.finish, FinishReason::stop);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.completion_tokens, 1);
  EXPECT_EQ(decode.pool().live(), 0u);
}

// A failed transfer frees the reservation; a refused import fails the request and frees it too.
TEST(Handover, FailureFreesTheReservation) {
  auto d_runner = std::make_shared<FakeRunner>();
  Engine decode(d_runner, options());
  Out a, b;
  const uint64_t ia = decode.submit_remote(request(40, 1, 8, 0), collect(a), nullptr);
  const uint64_t ib = decode.submit_remote(request(40, 2, 8, 0), collect(b), nullptr);
  decode.step();
  EXPECT_EQ(decode.metrics().num_transferring, 2);
  EXPECT_EQ(decode.pool().live(), 2u);
  decode.fail(ia, "prefill server gone");
  decode.step();
  EXPECT_EQ(a.finish, FinishReason::error);
  EXPECT_EQ(a.error, "prefill server gone");
  // A handover for another prompt is refused with a reason.
  auto h = std::make_shared<Handover>();
  h->prompt = prompt(40, 3);
  h->capacity = 48;
  std::string why;
  decode.provide_state(ib, h, [&](std::string e) { why = std::move(e); });
  run(decode);
  EXPECT_NE(why.find("another prompt"), std::string::npos) << why;
  EXPECT_EQ(b.finish, FinishReason::error);
  EXPECT_EQ(decode.pool().live(), 0u);
  EXPECT_EQ(decode.pool().used_bytes(), 0);
  EXPECT_EQ(decode.metrics().num_transferring, 0);
  EXPECT_TRUE(decode.idle());
}

// Reservations wait for memory in arrival order and respect the running cap.
TEST(Handover, ReservationsWaitForMemory) {
  auto d_runner = std::make_shared<FakeRunner>();
  auto o = options(int64_t{4} << 10);  // four pages of 1024 B: one sequence of 40 tokens at a time
  Engine decode(d_runner, o);
  Out a, b;
  int reserved = 0;
  decode.submit_remote(request(40, 1, 4, 0), collect(a), [&] { ++reserved; });
  const uint64_t ib = decode.submit_remote(request(40, 2, 4, 0), collect(b), [&] { ++reserved; });
  decode.step();
  EXPECT_EQ(reserved, 1);
  EXPECT_EQ(decode.metrics().num_waiting, 1);
  decode.abort(1);
  decode.step();
  EXPECT_EQ(reserved, 2);
  EXPECT_EQ(a.finish, FinishReason::abort);
  decode.abort(ib);
  run(decode);
  EXPECT_EQ(decode.pool().used_bytes(), 0);
}

TEST(Handover, ThreadedLoopSleepsWhileOnlyTransfersArePending) {
  auto p_runner = std::make_shared<FakeRunner>();
  auto d_runner = std::make_shared<FakeRunner>();
  Engine prefill(p_runner, options());
  Engine decode(d_runner, options());
  prefill.start();
  decode.start();
  std::mutex mu;
  std::condition_variable cv;
  Out p, d;
  std::atomic<bool> reserved{false};
  GenerationRequest r = request(30, 7, 6, 0);
  const uint64_t id = decode.submit_remote(r, collect(d), [&] { reserved = true; });
  r.handover = true;
  bool handed = false;
  prefill.submit(r, [&](RequestUpdate&& u) {
    if (u.finish == FinishReason::none) return;
    std::lock_guard lock(mu);
    p.handover = u.handover;
    handed = true;
    cv.notify_all();
  });
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return handed; }));
  }
  for (int i = 0; i < 1000 && !reserved; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(reserved);
  // Nothing to compute anywhere: the engine threads must sleep, not spin (process CPU time stays low).
  const std::clock_t cpu0 = std::clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(double(std::clock() - cpu0) / CLOCKS_PER_SEC, 0.05);
  decode.provide_state(id, p.handover, nullptr);
  for (int i = 0; i < 2000 && !decode.idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(decode.idle());
  decode.stop();
  prefill.stop();
}

}  // namespace
}  // namespace tern::engine
