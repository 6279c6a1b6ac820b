// Model discovery (GET /v1/models) against the test server on loopback: the first model is used, and
// every way it can go wrong is a clear error naming the URL, never a hang.
#include <gtest/gtest.h>

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <sstream>

#include "bench/discover.h"
#include "bench/runner.h"
#include "core/error.h"
#include "fake_server.h"

namespace tern::bench {
namespace {

using testing::FakeServer;
using testing::FakeServerOptions;

Target target_for(const FakeServer& server) {
  Target t;
  t.port = std::to_string(server.port());
  return t;
}

// The message discover_model throws (empty when it returned).
std::string discovery_error(const Target& t, double timeout_s = 5) {
  try {
    discover_model(t, timeout_s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Discover, FirstListedModelIsUsed) {
  FakeServerOptions options;
  options.models = {"first-model", "second-model"};
  FakeServer server(options);
  EXPECT_EQ(discover_model(target_for(server), 5), "first-model");
}

TEST(Discover, BenchRunWithoutModelAsksTheServer) {
  FakeServerOptions options;
  options.models = {"ok"};
  FakeServer server(options);
  BenchConfig config;
  config.target = target_for(server);
  config.workload.num_prompts = 3;
  config.workload.input_len = 8;
  config.workload.output_len = 4;
  config.progress = false;
  std::ostringstream out;
  BenchOutcome outcome = run_benchmark(config, out);
  EXPECT_NE(out.str().find("Model: ok (the first of GET /v1/models)"), std::string::npos) << out.str();
  EXPECT_EQ(outcome.context.model, "ok");
  ASSERT_EQ(outcome.runs.size(), 1u);
  EXPECT_EQ(outcome.runs[0].summary.completed, 3);
}

TEST(Discover, EmptyListIsAClearError) {
  FakeServerOptions options;
  options.models = {};
  FakeServer server(options);
  std::string e = discovery_error(target_for(server));
  EXPECT_NE(e.find("no --model given and GET http://127.0.0.1:"), std::string::npos) << e;
  EXPECT_NE(e.find("/v1/models returned an empty model list"), std::string::npos) << e;
  EXPECT_NE(e.find("give --model NAME"), std::string::npos) << e;
}

TEST(Discover, HttpErrorIsAClearError) {
  FakeServerOptions options;
  options.models_status = 401;
  FakeServer server(options);
  std::string e = discovery_error(target_for(server));
  EXPECT_NE(e.find("answered HTTP 401: \"no models for you\""), std::string::npos) << e;
}

TEST(Discover, SilentServerTimesOut) {
  FakeServerOptions options;
  options.models_status = 0;
  FakeServer server(options);
  auto start = std::chrono::steady_clock::now();
  std::string e = discovery_error(target_for(server), 0.3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_NE(e.find("got no answer within 0.3 s"), std::string::npos) << e;
}

TEST(Discover, UnreachableServerIsAClearError) {
  unsigned short port;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }
  Target t;
  t.port = std::to_string(port);
  std::string e = discovery_error(t);
  EXPECT_NE(e.find("failed: cannot connect: Connection refused"), std::string::npos) << e;
  BenchConfig config;
  config.target = t;
  config.progress = false;
  std::ostringstream out;
  EXPECT_THROW(run_benchmark(config, out), Error);
  t.host = "no-such-host.invalid";
  e = discovery_error(t);
  EXPECT_NE(e.find("failed: cannot resolve no-such-host.invalid"), std::string::npos) << e;
}

}  // namespace
}  // namespace tern::bench
