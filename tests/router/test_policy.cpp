// The router's pure parts: the routing policies and the circuit breaker of a pool.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "router/pool.h"
#include "router/policy.h"
#include "router/proxy.h"

namespace tern::router {
namespace {

std::vector<Candidate> candidates(const std::vector<std::string>& urls) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < urls.size(); ++i) c.push_back({urls[i], i, 0, 0});
  return c;
}

const std::vector<std::string> kUrls = {"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"};

TEST(Policy, RoundRobinCyclesAndSkipsMissingServers) {
  PolicyState st;
  auto c = candidates(kUrls);
  std::vector<size_t> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(c[choose(Policy::round_robin, c, "", st)].index);
  EXPECT_EQ(picks, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
  // Server 1 is down: the cycle continues over the others.
  std::vector<Candidate> up = {c[0], c[2]};
  st.next = 1;
  EXPECT_EQ(up[choose(Policy::round_robin, up, "", st)].index, 2u);
  EXPECT_EQ(up[choose(Policy::round_robin, up, "", st)].index, 0u);
}

TEST(Policy, LeastLoadedTakesFewestTokensThenFewestRequests) {
  PolicyState st;
  auto c = candidates(kUrls);
  c[0].load_tokens = 500;
  c[1].load_tokens = 100;
  c[2].load_tokens = 100;
  c[1].in_flight = 3;
  c[2].in_flight = 1;
  EXPECT_EQ(choose(Policy::least_loaded, c, "", st), 2u);
  c[2].load_tokens = 101;
  EXPECT_EQ(choose(Policy::least_loaded, c, "", st), 1u);
}

TEST(Policy, PrefixAffinityIsStableSpreadsAndMovesLittle) {
  PolicyState st;
  auto c = candidates(kUrls);
  std::map<size_t, int> counts;
  std::map<std::string, size_t> first;
  for (int i = 0; i < 300; ++i) {
    const std::string key = "prompt number " + std::to_string(i);
    const size_t pick = choose(Policy::prefix_affinity, c, key, st);
    EXPECT_EQ(choose(Policy::prefix_affinity, c, key, st), pick);  // same prefix, same server
    first[key] = pick;
    counts[pick]++;
  }
  for (size_t s = 0; s < 3; ++s) EXPECT_GT(counts[s], 60) << "server " << s;  // spread over all
  // Server 2 leaves: only its keys move.
  std::vector<Candidate> up = {c[0], c[1]};
  for (const auto& [key, pick] : first)
    if (pick != 2) EXPECT_EQ(up[choose(Policy::prefix_affinity, up, key, st)].index, pick) << key;
}

TEST(Policy, PrefixAffinityYieldsToAnOverloadedServer) {
  PolicyState st;
  st.affinity_slack_tokens = 100;
  auto c = candidates(kUrls);
  const std::string key = "a long shared system prompt";
  const size_t home = choose(Policy::prefix_affinity, c, key, st);
  c[home].load_tokens = 1000;
  EXPECT_NE(choose(Policy::prefix_affinity, c, key, st), home);
  c[home].load_tokens = 90;  // within the slack: stays home
  EXPECT_EQ(choose(Policy::prefix_affinity, c, key, st), home);
}

TEST(Policy, NamesRoundTripAndBadOnesAreRefused) {
  for (auto p : {Policy::round_robin, Policy::least_loaded, Policy::prefix_affinity})
    EXPECT_EQ(parse_policy(policy_name(p)), p);
  EXPECT_THROW(parse_policy("random"), Error);
}

TEST(Pool, ParsesUrlsAndRefusesBadOnes) {
  std::string host;
  uint16_t port = 0;
  parse_server_url("http://127.0.0.1:8001/", host, port);
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8001);
  for (const char* bad : {"127.0.0.1:8001", "http://127.0.0.1", "http://127.0.0.1:0", "http://127.0.0.1:99999",
                          "http://127.0.0.1:80/v1", "https://127.0.0.1:443"})
    EXPECT_THROW(parse_server_url(bad, host, port), Error) << bad;
  EXPECT_THROW(Pool(PoolKind::plain, {"http://127.0.0.1:1", "http://127.0.0.1:1"}, Policy::round_robin, {}), Error);
}

TEST(Pool, CircuitBreakerOpensCoolsDownTriesOnceAndCloses) {
  BreakerOptions b{3, std::chrono::milliseconds(1000)};
  Pool pool(PoolKind::plain, {kUrls[0], kUrls[1]}, Policy::round_robin, b);
  for (auto& s : pool.servers()) s->healthy = true;
  ServerState& s0 = *pool.servers()[0];
  const auto t0 = Clock::now();
  pool.failed(s0, "x", t0);
  pool.failed(s0, "x", t0);
  EXPECT_TRUE(s0.available(t0, b));
  pool.failed(s0, "x", t0);  // third in a row: open
  EXPECT_FALSE(s0.available(t0, b));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.pick("", {}, t0), pool.servers()[1].get());
  // After the cooldown the next request is its trial; while the trial runs, other requests go to the
  // other server, and join the trial only when nothing else is left (never refused for it).
  const auto t1 = t0 + std::chrono::milliseconds(1001);
  std::vector<const ServerState*> avoid = {pool.servers()[1].get()};
  EXPECT_EQ(pool.pick("", avoid, t1), &s0);
  EXPECT_TRUE(s0.on_trial());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(pool.pick("", {}, t1), pool.servers()[1].get());
  EXPECT_EQ(pool.pick("", avoid, t1), &s0);
  pool.servers()[1]->healthy = false;
  EXPECT_EQ(pool.pick("", {}, t1), &s0);
  pool.servers()[1]->healthy = true;
  pool.failed(s0, "x", t1);  // the trial failed: open again from now
  EXPECT_FALSE(s0.available(t1 + std::chrono::milliseconds(999), b));
  EXPECT_EQ(pool.pick("", avoid, t1 + std::chrono::milliseconds(1001)), &s0);
  pool.succeeded(s0);  // the trial succeeded: closed
  EXPECT_TRUE(s0.available(t1, b));
  EXPECT_EQ(s0.consecutive_failures, 0);
  // A success in between resets the count.
  pool.failed(s0, "x", t1);
  pool.failed(s0, "x", t1);
  pool.succeeded(s0);
  pool.failed(s0, "x", t1);
  EXPECT_TRUE(s0.available(t1, b));
}

TEST(Pool, UnhealthyServersAreNeverPickedAndAvoidedOnesOnlyAsALastResort) {
  Pool pool(PoolKind::decode, kUrls, Policy::least_loaded, {});
  EXPECT_EQ(pool.pick("", {}, Clock::now()), nullptr);
  pool.servers()[1]->healthy = true;
  pool.servers()[2]->healthy = true;
  EXPECT_EQ(pool.pick("", {}, Clock::now()), pool.servers()[1].get());
  std::vector<const ServerState*> avoid = {pool.servers()[1].get()};
  EXPECT_EQ(pool.pick("", avoid, Clock::now()), pool.servers()[2].get());
  avoid.push_back(pool.servers()[2].get());
  EXPECT_NE(pool.pick("", avoid, Clock::now()), nullptr);  // all failed once: any up server
}

TEST(RouteInfo, ReadsPromptLoadAndKindAndNeverThrows) {
  const auto chat = route_info("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":100,"n":2})");
  EXPECT_TRUE(chat.generation);
  EXPECT_EQ(chat.affinity_key.rfind("/v1/chat/completions\n[{", 0), 0u) << chat.affinity_key;
  EXPECT_GE(chat.load_tokens, 200);
  const auto text = route_info("/v1/completions?x=1", R"({"prompt":"abc"})");
  EXPECT_TRUE(text.generation);
  EXPECT_EQ(text.affinity_key, "/v1/completions\nabc");
  EXPECT_EQ(text.load_tokens, 16);  // no max_tokens: 16
  // Same first 256 bytes, same key: the affinity follows the prefix.
  const std::string p(300, 'x');
  EXPECT_EQ(route_info("/v1/completions", R"({"prompt":")" + p + "a\"}").affinity_key,
            route_info("/v1/completions", R"({"prompt":")" + p + "b\"}").affinity_key);
  const auto junk = route_info("/v1/completions", "not json");
  EXPECT_EQ(junk.affinity_key, "");
  EXPECT_GT(junk.load_tokens, 0);
  EXPECT_FALSE(route_info("/tokenize", R"({"prompt":"abc"})").generation);
}

}  // namespace
}  // namespace tern::router
