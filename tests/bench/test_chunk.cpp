// One stream chunk as the benchmark reads it (bench/chunk.h), and the request bodies it sends.
#include <gtest/gtest.h>

#include "bench/chunk.h"
#include "bench/request.h"
#include "core/error.h"

namespace tern::bench {
namespace {

TEST(Chunk, ChatContentReasoningAndRoleOnly) {
  auto content = read_chunk(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})", Api::chat);
  EXPECT_TRUE(content.has_content);
  EXPECT_EQ(content.content_bytes, 2u);
  auto reasoning = read_chunk(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})", Api::chat);
  EXPECT_TRUE(reasoning.has_content);
  auto role = read_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})", Api::chat);
  EXPECT_FALSE(role.has_content);  // a role chunk is not the first token
  auto null_content = read_chunk(R"({"choices":[{"delta":{"content":null}}]})", Api::chat);
  EXPECT_FALSE(null_content.has_content);
}

TEST(Chunk, CompletionsTextFinishAndUsage) {
  auto c = read_chunk(R"({"choices":[{"text":"abc","finish_reason":"length"}]})", Api::completions);
  EXPECT_TRUE(c.has_content);
  EXPECT_EQ(c.finish_reason, "length");
  auto u = read_chunk(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}})",
                      Api::completions);
  EXPECT_FALSE(u.has_content);
  EXPECT_EQ(u.completion_tokens.value_or(-1), 9);
  EXPECT_EQ(u.prompt_tokens.value_or(-1), 5);
  auto null_usage = read_chunk(R"({"choices":[{"text":"x"}],"usage":null})", Api::completions);
  EXPECT_FALSE(null_usage.completion_tokens);
}

TEST(Chunk, DoneErrorsAndMalformed) {
  EXPECT_TRUE(read_chunk("[DONE]", Api::chat).done);
  auto err = read_chunk(R"({"error":{"message":"out of memory","code":500}})", Api::chat);
  EXPECT_EQ(err.error, "server error in stream: out of memory");
  EXPECT_FALSE(err.malformed);
  auto bad = read_chunk("{not json", Api::chat);
  EXPECT_TRUE(bad.malformed);
  EXPECT_NE(bad.error.find("malformed SSE"), std::string::npos);
  EXPECT_TRUE(read_chunk("[1,2]", Api::chat).malformed);
}

TEST(Request, BodiesAskForAStreamWithUsage) {
  Target t;
  t.model = "m";
  t.ignore_eos = true;
  t.extra_body = {{"top_k", 1}};
  RequestSpec r{"hello", {}, 1, 32};
  auto chat = nlohmann::json::parse(request_body(t, r, "u1"));
  EXPECT_EQ(chat["messages"][0]["content"], "hello");
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
  EXPECT_EQ(chat["ignore_eos"], true);
  EXPECT_EQ(chat["top_k"], 1);
  EXPECT_EQ(chat["user"], "u1");
  t.api = Api::completions;
  RequestSpec ids{"", {5, 6, 7}, 3, 4};
  auto comp = nlohmann::json::parse(request_body(t, ids, ""));
  EXPECT_EQ(comp["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_FALSE(comp.contains("user"));
}

TEST(Request, BaseUrlParsing) {
  Target t;
  parse_base_url("http://localhost:8080", t);
  EXPECT_EQ(t.host, "localhost");
  EXPECT_EQ(t.port, "8080");
  parse_base_url("http://[::1]:9000/v1/completions", t);
  EXPECT_EQ(t.host, "::1");
  EXPECT_EQ(t.port, "9000");
  EXPECT_EQ(t.path, "/v1/completions");
  EXPECT_THROW(parse_base_url("https://x:1", t), Error);
  std::string req = http_request(t, "{}");
  EXPECT_NE(req.find("Host: [::1]:9000\r\n"), std::string::npos);
  EXPECT_NE(req.find("Content-Length: 2\r\n"), std::string::npos);
}

}  // namespace
}  // namespace tern::bench
