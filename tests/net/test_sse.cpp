// The text/event-stream framing (net/sse.h): events survive any split of the bytes.
#include <gtest/gtest.h>

#include "net/sse.h"

namespace tern::net {
namespace {

std::vector<std::string> feed_in_pieces(const std::string& text, std::size_t piece) {
  SseParser p;
  std::vector<std::string> events;
  for (std::size_t i = 0; i < text.size(); i += piece) p.feed(std::string_view(text).substr(i, piece), events);
  return events;
}

TEST(Sse, EventsSurviveAnySplitOfTheBytes) {
  std::string text = "data: {\"a\":1}\n\n: keep-alive comment\n\ndata: [DONE]\n\n";
  for (std::size_t piece : {1u, 2u, 5u, 100u}) {
    auto events = feed_in_pieces(text, piece);
    ASSERT_EQ(events.size(), 2u) << "piece " << piece;
    EXPECT_EQ(events[0], "{\"a\":1}");
    EXPECT_EQ(events[1], "[DONE]");
  }
}

TEST(Sse, CrLfMultiLineDataAndOtherFields) {
  auto events = feed_in_pieces("event: x\r\nid: 3\r\ndata: one\r\ndata:two\r\n\r\ndata: three\r\r", 3);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "one\ntwo");
  EXPECT_EQ(events[1], "three");
}

TEST(Sse, FlushReturnsAnUnterminatedEvent) {
  SseParser p;
  std::vector<std::string> events;
  p.feed("data: [DONE]", events);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(p.flush().value_or(""), "[DONE]");
}

}  // namespace
}  // namespace tern::net
