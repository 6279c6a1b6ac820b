#include <gtest/gtest.h>

#include "engine/scheduler.h"

namespace tern::engine {
namespace {

PageGeometry geometry() {
  PageGeometry g;
  g.page_bytes = 100;
  g.fixed_pages = 1;       // one page per sequence
  g.tokens_per_page = 10;  // and one per 10 tokens
  return g;
}

SchedulerInput input(const std::vector<SchedSeq>& running, const std::vector<SchedSeq>& waiting, int64_t free_pages,
                     int64_t budget = 64) {
  SchedulerInput in{running, waiting, free_pages, geometry(), {}};
  in.limits.token_budget = budget;
  in.limits.max_chunk = 32;
  in.limits.max_running = 4;
  return in;
}

TEST(Scheduler, AdmitsFirstComeFirstServedInChunks) {
  std::vector<SchedSeq> waiting{{1, 100, 0, 0}, {2, 5, 0, 0}};
  const auto plan = schedule(input({}, waiting, 100));
  ASSERT_EQ(plan.admitted, (std::vector<uint64_t>{1, 2}));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].count, 32);  // max_chunk
  EXPECT_FALSE(plan.chunks[0].sample);
  EXPECT_EQ(plan.chunks[1].count, 5);
  EXPECT_TRUE(plan.chunks[1].sample);
}

TEST(Scheduler, DecodesComeBeforePrefillChunks) {
  std::vector<SchedSeq> running{{1, 200, 100, 12}, {2, 51, 50, 7}};
  const auto plan = schedule(input(running, {}, 100, 20));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 2u);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_TRUE(plan.chunks[0].sample);
  EXPECT_EQ(plan.chunks[1].id, 1u);
  EXPECT_EQ(plan.chunks[1].start, 100);
  EXPECT_EQ(plan.chunks[1].count, 19);  // what the budget leaves
  EXPECT_EQ(plan.num_tokens(), 20);
}

// Speculative decoding: a decoding sequence's drafts take budget and pages after its token; the budget left decides
// how many the later ones get, and prefill chunks get what remains.
TEST(Scheduler, DraftsTakeBudgetAndPages) {
  std::vector<SchedSeq> running{{1, 19, 18, 2, 0, 3}, {2, 8, 7, 2, 0, 3}, {3, 60, 20, 3, 0, 3}};
  auto plan = schedule(input(running, {}, 100, 6));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1u);
  EXPECT_EQ(plan.chunks[0].count, 1);
  EXPECT_EQ(plan.chunks[0].drafts, 3);
  EXPECT_EQ(plan.chunks[1].id, 2u);
  EXPECT_EQ(plan.chunks[1].drafts, 1);  // 6 - 4 - 1
  EXPECT_EQ(plan.num_tokens(), 6);
  // Pages for the verified positions: sequence 1 (fixed + 2 row pages of 10 tokens) verifies 18 .. 21 and takes a
  // fourth, sequence 2 (7 tokens, 2 pages) verifies 7 .. 10 and takes a third; the prefill chunk 20 .. 29 one more.
  running[0].pages_held = 3;
  plan = schedule(input(running, {}, 3, 18));
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(plan.chunks[0].drafts, 3);
  EXPECT_EQ(plan.chunks[1].drafts, 3);
  EXPECT_EQ(plan.preempted.size(), 0u);
  EXPECT_EQ(plan.chunks.back().id, 3u);  // the prefill chunk after the decodes: 18 - 4 - 4
  EXPECT_EQ(plan.chunks.back().count, 10);
  EXPECT_TRUE(schedule(input(running, {}, 2, 18)).preempted.size() == 1u);  // one page short: someone waits
  // A prefilling sequence never drafts.
  for (const auto& c : plan.chunks)
    if (c.id == 3) EXPECT_EQ(c.drafts, 0);
}

TEST(Scheduler, RespectsTokenBudgetAndRunningCap) {
  std::vector<SchedSeq> waiting;
  for (uint64_t i = 1; i <= 6; ++i) waiting.push_back({i, 10, 0, 0});
  auto plan = schedule(input({}, waiting, 1000, 25));
  EXPECT_EQ(plan.admitted.size(), 3u);  // 10 + 10 + 5
  EXPECT_EQ(plan.chunks.back().count, 5);
  EXPECT_EQ(plan.num_tokens(), 25);
  plan = schedule(input({}, waiting, 1000, 1000));
  EXPECT_EQ(plan.admitted.size(), 4u);  // max_running
}

TEST(Scheduler, HeadOfQueueThatDoesNotFitBlocksAdmission) {
  std::vector<SchedSeq> waiting{{1, 30, 0, 0}, {2, 1, 0, 0}};
  const auto plan = schedule(input({}, waiting, 3));  // 1 needs 1 + 3 pages
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_TRUE(plan.chunks.empty());
}

TEST(Scheduler, PreemptsYoungestWhenAPageIsMissing) {
  // Both at a page boundary: each decode needs one more page, one is free.
  std::vector<SchedSeq> running{{1, 11, 10, 2}, {2, 21, 20, 3}, {3, 31, 30, 4}};
  const auto plan = schedule(input(running, {{9, 5, 0, 0}}, 1));
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{3}));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1u);
  EXPECT_EQ(plan.chunks[1].id, 2u);
  EXPECT_TRUE(plan.admitted.empty());  // no admission while preempting
}

TEST(Scheduler, PreemptsItselfWhenItIsTheYoungest) {
  std::vector<SchedSeq> running{{1, 15, 14, 3}, {2, 11, 10, 2}};
  const auto plan = schedule(input(running, {}, 0));
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 1u);
}

TEST(Scheduler, ScheduledChunkOfAVictimIsDropped) {
  // 2 decodes first (fits), then 1's prefill chunk needs pages: 2 is preempted and its chunk removed.
  std::vector<SchedSeq> running{{1, 40, 10, 2}, {2, 6, 5, 2}};
  const auto plan = schedule(input(running, {}, 1));
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].id, 1u);
  EXPECT_EQ(plan.chunks[0].count, 30);
}

TEST(Scheduler, SequenceThatCannotGrowAloneIsOutOfMemory) {
  std::vector<SchedSeq> running{{1, 11, 10, 2}};
  const auto plan = schedule(input(running, {}, 0));
  EXPECT_EQ(plan.out_of_memory, (std::vector<uint64_t>{1}));
  EXPECT_TRUE(plan.chunks.empty());
}

TEST(Scheduler, PreemptedSequenceIsReadmittedWithItsTokens) {
  std::vector<SchedSeq> waiting{{3, 31, 0, 0}};
  const auto plan = schedule(input({}, waiting, 100));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].count, 31 > 32 ? 32 : 31);
  EXPECT_TRUE(plan.chunks[0].sample);
}


// Fairness across clients (the last field of SchedSeq): client 7 has a large batch, client 9 one request.

TEST(Scheduler, AdmissionAlternatesBetweenClients) {
  std::vector<SchedSeq> waiting{{1, 5, 0, 0, 7}, {2, 5, 0, 0, 7}, {3, 5, 0, 0, 7}, {4, 5, 0, 0, 9}};
  auto in = input({}, waiting, 100);
  in.limits.max_running = 2;
  EXPECT_EQ(schedule(in).admitted, (std::vector<uint64_t>{1, 4}));  // not 1, 2: client 9 has none running
  in.limits.max_running = 4;
  EXPECT_EQ(schedule(in).admitted, (std::vector<uint64_t>{1, 4, 2, 3}));
}

TEST(Scheduler, AClientWithoutSlotsTakesOneFromTheBusiestClient) {
  std::vector<SchedSeq> running{{1, 51, 50, 6, 7}, {2, 51, 50, 6, 7}, {3, 51, 50, 6, 7}, {4, 51, 50, 6, 7}};
  const auto plan = schedule(input(running, {{5, 6, 0, 0, 7}, {6, 5, 0, 0, 9}}, 100));
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{4}));  // client 7's youngest
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{6}));
  ASSERT_EQ(plan.chunks.size(), 4u);  // 1, 2, 3 decode; 6 prefills
  EXPECT_EQ(plan.chunks.back().id, 6u);
}

TEST(Scheduler, AClientWithoutPagesTakesThemFromTheBusiestClient) {
  std::vector<SchedSeq> running{{1, 51, 50, 6, 7}, {2, 51, 50, 6, 7}};
  const std::vector<SchedSeq> waiting{{6, 25, 0, 0, 9}};
  auto in = input(running, waiting, 2);  // 1 and 2 take the 2 free pages to grow; 9 needs 1 + 3
  in.limits.max_running = 8;
  const auto plan = schedule(in);
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
  EXPECT_EQ(plan.admitted, (std::vector<uint64_t>{6}));
}

TEST(Scheduler, FairShareStopsWithinOneSequence) {
  // Client 7 runs 3, client 9 runs 2: 9's next sequence waits for a free slot like anyone's.
  std::vector<SchedSeq> running{{1, 51, 50, 6, 7}, {2, 51, 50, 6, 7}, {3, 51, 50, 6, 9}, {4, 51, 50, 6, 7},
                                {5, 51, 50, 6, 9}};
  const std::vector<SchedSeq> waiting{{6, 5, 0, 0, 9}};
  auto in = input(running, waiting, 100);
  in.limits.max_running = 5;
  const auto plan = schedule(in);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_TRUE(plan.admitted.empty());
}

TEST(Scheduler, PrefillChunksGoRoundRobinAcrossClients) {
  // Client 7's two prompts are older, but client 9's gets its chunk before 7's second.
  std::vector<SchedSeq> running{{1, 100, 0, 1, 7}, {2, 100, 0, 1, 7}, {3, 100, 0, 1, 9}};
  const auto plan = schedule(input(running, {}, 100, 64));
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].id, 1u);
  EXPECT_EQ(plan.chunks[1].id, 3u);
}

TEST(Scheduler, PagesAreTakenFromTheBusiestClientFirst) {
  // 3 (client 9) is the youngest, but client 7 holds more: its youngest (2) makes room.
  std::vector<SchedSeq> running{{1, 11, 10, 2, 7}, {2, 21, 20, 3, 7}, {3, 31, 30, 4, 9}};
  const auto plan = schedule(input(running, {}, 1));
  EXPECT_EQ(plan.preempted, (std::vector<uint64_t>{2}));
}

}  // namespace
}  // namespace tern::engine
