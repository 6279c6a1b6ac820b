// The transfer layer on its own, over real loopback TCP: the control channel's framing and heartbeat
// timeout, the TCP data backend (landing, sending, refusals, cancellation) and the message codecs.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <numeric>

#include "core/error.h"
#include "transfer/channel.h"
#include "transfer/decode_rooms.h"
#include "transfer/messages.h"
#include "transfer/tcp_backend.h"

namespace tern::transfer {
namespace {

using namespace std::chrono_literals;

// Runs the io_context until `done` or the timeout; false on timeout.
bool run_until(boost::asio::io_context& io, const std::function<bool()>& done, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    io.run_for(5ms);
    io.restart();
  }
  return true;
}

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  return v;
}

TEST(TcpBackend, LandsSegmentsBackToBack) {
  boost::asio::io_context io;
  auto decode = make_tcp_backend(io, {"127.0.0.1", 0, true});
  auto prefill = make_tcp_backend(io, {"127.0.0.1", 0, false});
  const auto a = pattern(3 << 20, 1), b = pattern(12345, 2);
  auto landing = decode->land(a.size() + b.size(), "127.0.0.1");
  EXPECT_EQ(decode->landed_bytes(), a.size() + b.size());
  EXPECT_FALSE(landing->complete());
  std::string result = "pending";
  prefill->send(landing->descriptor(), {Segment(a), Segment(b)}, [&](std::string e) { result = std::move(e); });
  ASSERT_TRUE(run_until(io, [&] { return result != "pending"; }));
  EXPECT_EQ(result, "");
  ASSERT_TRUE(landing->complete());
  const TensorView landed = landing->bytes();
  ASSERT_EQ(landed.device(), Device::cpu);
  const std::vector<std::byte> got(landed.data_as<std::byte>(), landed.data_as<std::byte>() + landed.nbytes());
  std::vector<std::byte> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(got, want);
  landing.reset();
  EXPECT_EQ(decode->landed_bytes(), 0u);
}

TEST(TcpBackend, RefusesWrongSizesUnknownKeysAndDroppedLandings) {
  boost::asio::io_context io;
  auto decode = make_tcp_backend(io, {"127.0.0.1", 0, true});
  auto prefill = make_tcp_backend(io, {"127.0.0.1", 0, false});
  const auto data = pattern(1000, 3);
  auto send = [&](const std::string& descriptor, size_t n) {
    std::string result = "pending";
    prefill->send(descriptor, {Segment(data.data(), n)}, [&](std::string e) { result = std::move(e); });
    EXPECT_TRUE(run_until(io, [&] { return result != "pending"; }));
    return result;
  };
  auto landing = decode->land(1000, "127.0.0.1");
  EXPECT_NE(send(landing->descriptor(), 999).find("the landing holds 1000"), std::string::npos);
  // Another key on the same port: refused by the decode side.
  std::string other = landing->descriptor();
  other.replace(other.rfind('/') - 4, 4, "0000");
  EXPECT_NE(send(other, 1000).find("refused"), std::string::npos);
  EXPECT_FALSE(landing->complete());
  const std::string d = landing->descriptor();
  landing.reset();
  EXPECT_NE(send(d, 1000).find("refused"), std::string::npos);
  for (const char* bad : {"tcp://127.0.0.1/1/2", "udp://1.2.3.4:5/1/2", "tcp://127.0.0.1:0/1/2", "tcp://127.0.0.1:5/zz/2"})
    EXPECT_NE(send(bad, 2).find("malformed descriptor"), std::string::npos) << bad;
  // A port where nothing listens.
  EXPECT_NE(send("tcp://127.0.0.1:1/00000000000000ab/1000", 1000).find("cannot connect"), std::string::npos);
}

TEST(TcpBackend, CancelEndsTheSendWithAnError) {
  boost::asio::io_context io;
  auto decode = make_tcp_backend(io, {"127.0.0.1", 0, true});
  auto prefill = make_tcp_backend(io, {"127.0.0.1", 0, false});
  const auto data = pattern(64 << 20, 4);
  auto landing = decode->land(data.size(), "127.0.0.1");
  std::string result = "pending";
  auto cancel = prefill->send(landing->descriptor(), {Segment(data)}, [&](std::string e) { result = std::move(e); });
  cancel();
  ASSERT_TRUE(run_until(io, [&] { return result != "pending"; }));
  EXPECT_EQ(result, "tcp transfer: cancelled");
}

TEST(Channel, FramesFlowBothWaysAndSilenceTimesOut) {
  boost::asio::io_context io;
  ChannelOptions o;
  o.heartbeat = 50ms;
  o.peer_timeout = 300ms;
  std::shared_ptr<Channel> server_side;
  std::vector<std::pair<Frame, std::string>> got;
  auto listener = Listener::listen(io, "127.0.0.1", 0, o, [&](std::shared_ptr<Channel> c) {
    server_side = c;
    c->start([&](Frame f, std::string p) { got.emplace_back(f, std::move(p)); }, [](const std::string&, bool) {});
  });
  std::shared_ptr<Channel> client;
  Channel::connect(io, "127.0.0.1", listener->port(), o, [&](std::shared_ptr<Channel> c, const std::string& e) {
    ASSERT_EQ(e, "");
    client = c;
  });
  ASSERT_TRUE(run_until(io, [&] { return client && server_side; }));
  std::string closed;
  client->start([](Frame, std::string) {}, [&](const std::string& why, bool timeout) { closed = cat(timeout, why); });
  client->send(Frame::hello, "one");
  client->send(Frame::offer, std::string(100000, 'x'));
  ASSERT_TRUE(run_until(io, [&] { return got.size() == 2; }));
  EXPECT_EQ(got[0], std::make_pair(Frame::hello, std::string("one")));
  EXPECT_EQ(got[1].second.size(), 100000u);
  // Heartbeats keep an idle channel open well past the peer timeout.
  io.run_for(600ms);
  io.restart();
  EXPECT_EQ(closed, "");
  EXPECT_TRUE(client->open());
  // A peer that goes silent (its heartbeats stop, its socket stays open) is given up after the timeout.
  int raw = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(listener->port());
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::connect(raw, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string silent;
  server_side = nullptr;
  ASSERT_TRUE(run_until(io, [&] { return server_side != nullptr; }));
  server_side->start([](Frame, std::string) {}, [&](const std::string& why, bool timeout) { silent = cat(timeout, ":", why); });
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(run_until(io, [&] { return !silent.empty(); }, 3000ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(silent.rfind("1:no heartbeat", 0), 0u) << silent;
  EXPECT_GE(waited, 250ms);
  ::close(raw);
  // The other end closing is reported at once, not as a timeout.
  server_side = nullptr;
  got.clear();
  client->close();
  Channel::connect(io, "127.0.0.1", listener->port(), o, [&](std::shared_ptr<Channel> c, const std::string&) { client = c; });
  ASSERT_TRUE(run_until(io, [&] { return server_side != nullptr; }));
  std::string peer_closed;
  server_side->start([](Frame, std::string) {}, [&](const std::string& why, bool timeout) { peer_closed = cat(timeout, ":", why); });
  client->close();
  ASSERT_TRUE(run_until(io, [&] { return !peer_closed.empty(); }, 1000ms));
  EXPECT_NE(peer_closed.find("0:the peer"), std::string::npos) << peer_closed;
}

TEST(Channel, ConnectFailuresSayWhy) {
  boost::asio::io_context io;
  std::string error;
  Channel::connect(io, "127.0.0.1", 1, {}, [&](std::shared_ptr<Channel> c, const std::string& e) {
    EXPECT_EQ(c, nullptr);
    error = e;
  });
  ASSERT_TRUE(run_until(io, [&] { return !error.empty(); }));
  EXPECT_NE(error.find("cannot connect to 127.0.0.1:1"), std::string::npos) << error;
  error.clear();
  Channel::connect(io, "not-an-ip", 1, {}, [&](std::shared_ptr<Channel>, const std::string& e) { error = e; });
  EXPECT_NE(error.find("not an IP address"), std::string::npos);
}

TEST(Messages, RoundTripAndRefuseMalformed) {
  Hello h;
  h.key = {0xfedcba9876543210ull, 3};
  h.prompt_len = 77;
  h.prompt_hash = prompt_hash(std::vector<int32_t>{1, 2, 3});
  h.capacity = 100;
  h.model = "m";
  h.backend = "tcp";
  const Hello back = decode_hello(encode(h));
  EXPECT_EQ(back.key, h.key);
  EXPECT_EQ(back.prompt_hash, h.prompt_hash);
  EXPECT_EQ(back.capacity, 100);
  EXPECT_EQ(h.key.name(), "fedcba9876543210/3");
  Offer o;
  o.state_bytes = 12345;
  o.first = {42, -1.25f, {{42, -1.25f}, {7, -3.0000001f}}};
  o.rng = "1 2 3";
  const Offer ob = decode_offer(encode(o));
  EXPECT_EQ(ob.first.token, 42);
  EXPECT_EQ(ob.first.logprob, -1.25f);
  ASSERT_EQ(ob.first.top.size(), 2u);
  EXPECT_EQ(ob.first.top[1].logprob, -3.0000001f);  // exact: floats survive the JSON
  EXPECT_THROW(decode_hello("{"), Error);
  EXPECT_THROW(decode_hello(R"({"version":2})"), Error);
  EXPECT_THROW(decode_offer(R"({"state_bytes":0,"token":1,"logprob":0,"top":[],"rng":""})"), Error);
  EXPECT_THROW(decode_offer(R"({"state_bytes":5,"token":"x","logprob":0,"top":[],"rng":""})"), Error);
  EXPECT_NE(prompt_hash(std::vector<int32_t>{1, 2}), prompt_hash(std::vector<int32_t>{2, 1}));
}

TEST(Messages, HostPorts) {
  EXPECT_EQ(parse_host_port("10.0.0.1:80"), std::make_pair(std::string("10.0.0.1"), uint16_t{80}));
  EXPECT_EQ(parse_host_port("[::1]:9"), std::make_pair(std::string("::1"), uint16_t{9}));
  for (const char* bad : {"10.0.0.1", ":80", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:70000", "10.0.0.1:8x"})
    EXPECT_THROW(parse_host_port(bad), Error) << bad;
}

}  // namespace
}  // namespace tern::transfer
