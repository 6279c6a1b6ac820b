// What src/net writes and reads besides HTTP itself: bearer tokens, room ids, Prometheus text, the OpenAI
// error shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "net/auth.h"
#include "net/openai.h"
#include "net/prometheus.h"
#include "net/room.h"

namespace tern::net {
namespace {

TEST(Auth, BearerTokens) {
  EXPECT_TRUE(bearer_authorized("", ""));  // no key configured
  EXPECT_TRUE(bearer_authorized("Bearer k1", "k1"));
  EXPECT_TRUE(bearer_authorized("bEARER   k1", "k1"));  // the scheme in any case, several spaces
  for (const char* a : {"", "Bearer", "Bearer ", "Bearer k", "Bearer k12", "Basic k1", "Bearerk1", "k1"})
    EXPECT_FALSE(bearer_authorized(a, "k1")) << a;
}

TEST(Room, HexRoundTrip) {
  EXPECT_EQ(room_hex(255), "00000000000000ff");
  EXPECT_EQ(parse_room(room_hex(0x0123456789abcdefULL)), 0x0123456789abcdefULL);
  EXPECT_EQ(parse_room("00FF"), 255u);
  EXPECT_THROW(parse_room(""), Error);
  EXPECT_THROW(parse_room("12345678901234567"), Error);
  EXPECT_THROW(parse_room("g"), Error);
}

TEST(Prometheus, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  for (double v : {0.0625, 0.5, 0.75, 5.0}) h.observe(v);
  std::string out;
  prom_histogram(out, "x_seconds", "Help.", h, "a=\"b\"");
  EXPECT_EQ(out,
            "# HELP tern:x_seconds Help.\n# TYPE tern:x_seconds histogram\n"
            "tern:x_seconds_bucket{a=\"b\",le=\"0.1\"} 1\ntern:x_seconds_bucket{a=\"b\",le=\"1\"} 3\n"
            "tern:x_seconds_bucket{a=\"b\",le=\"+Inf\"} 4\ntern:x_seconds_sum{a=\"b\"} 6.3125\n"
            "tern:x_seconds_count{a=\"b\"} 4\n");
}

TEST(OpenAi, ErrorShapeAndHeaders) {
  const ApiError e(401, "no key", "", "", "invalid_api_key");
  const auto j = nlohmann::json::parse(render_error(e));
  EXPECT_EQ(j["error"]["message"], "no key");
  EXPECT_EQ(j["error"]["type"], "authentication_error");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_EQ(error_headers(e), (Headers{{"WWW-Authenticate", "Bearer"}}));
  EXPECT_EQ(error_headers(ApiError(503, "busy")), (Headers{{"Retry-After", "1"}}));
}

}  // namespace
}  // namespace tern::net
