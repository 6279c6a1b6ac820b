// DeepSeek-V4 chat encoding against worked examples of encoding_dsv4.py, and the output parser
// (one-shot, streaming in every chunking, malformed input).
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/chat_parser.h"

namespace tern::tokenizer {
namespace {

ordered_json examples() {
  std::ifstream in(TERN_SOURCE_DIR "/tests/tokenizer/data/chat_examples.json");
  return ordered_json::parse(in);
}

ChatOptions options_of(const ordered_json& o) {
  ChatOptions opt;
  opt.thinking_mode = o.value("thinking_mode", "thinking") == "chat" ? ThinkingMode::chat : ThinkingMode::thinking;
  if (o.contains("reasoning_effort")) opt.reasoning_effort = o["reasoning_effort"].get<std::string>();
  opt.drop_thinking = o.value("drop_thinking", true);
  opt.add_bos = o.value("add_default_bos_token", true);
  opt.effort_prompts = EffortPrompts::ga_0731;
  return opt;
}

TEST(ChatEncoding, WorkedExamplesOfTheReference) {
  const ordered_json data = examples();
  ASSERT_GE(data["cases"].size(), 20u);
  for (const ordered_json& c : data["cases"]) {
    EXPECT_EQ(encode_chat(c["messages"], options_of(c["options"])), c["prompt"].get<std::string>()) << c["name"];
  }
}

TEST(ChatEncoding, FlashReleaseEffortPrompts) {
  const ordered_json msgs = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  ChatOptions opt;
  opt.reasoning_effort = "max";
  EXPECT_TRUE(encode_chat(msgs, opt).starts_with(std::string(chat_tokens::bos) + "Reasoning Effort: Absolute maximum"));
  opt.reasoning_effort = "high";
  EXPECT_EQ(encode_chat(msgs, opt), std::string(chat_tokens::bos) + "<｜User｜>hi<｜Assistant｜><think>");
  opt.reasoning_effort = "low";
  EXPECT_THROW(encode_chat(msgs, opt), Error);
}

TEST(ChatEncoding, RequestToolsGoToTheFirstSystemMessage) {
  const ordered_json data = examples();
  for (const ordered_json& c : data["cases"]) {
    if (c["name"] != "tools_thinking") continue;
    ordered_json msgs = c["messages"];
    const ordered_json tools = msgs[0]["tools"];
    msgs[0].erase("tools");
    EXPECT_EQ(encode_chat(msgs, options_of(c["options"]), tools), c["prompt"].get<std::string>());
  }
}

TEST(ChatEncoding, RejectsUnknownRoles) {
  EXPECT_THROW(encode_chat(ordered_json::parse(R"([{"role": "wizard", "content": "x"}])"), {}), Error);
}

TEST(ChatEncoding, PythonJsonLayout) {
  const ordered_json v = ordered_json::parse(R"({"b": [1, 2.5, true, null], "a": "é\n\u0001\"", "c": {}})");
  EXPECT_EQ(python_json_dumps(v), "{\"b\": [1, 2.5, true, null], \"a\": \"é\\n\\u0001\\\"\", \"c\": {}}");
}

// Generated text of an assistant turn, as the model writes it after the prompt.
std::string generated(const std::string& reasoning, const std::string& content, const ordered_json& calls) {
  ordered_json msgs = ordered_json::array({{{"role", "user"}, {"content", "q"}},
                                           {{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning}}});
  if (!calls.empty()) msgs[1]["tool_calls"] = calls;
  ChatOptions opt;
  opt.drop_thinking = false;
  const std::string prompt = encode_chat(msgs, opt);
  const std::string head = std::string(chat_tokens::bos) + "<｜User｜>q<｜Assistant｜><think>";
  return prompt.substr(head.size());
}

const ordered_json kCalls = ordered_json::parse(R"([
  {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 3}"}},
  {"id": "2", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
  {"id": "3", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"a<b \\\"c\\\"\", \"o\": {\"k\": [1, null]}}"}}])");

TEST(ChatParser, RoundTripsAnEncodedAssistantTurn) {
  const std::string text = generated("Let me think.", "Calling tools.", kCalls);
  const ParsedMessage m = parse_completion(text, ThinkingMode::thinking);
  EXPECT_EQ(m.reasoning_content, "Let me think.");
  EXPECT_EQ(m.content, "Calling tools.");
  EXPECT_TRUE(m.finished);
  ASSERT_EQ(m.tool_calls.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(m.tool_calls[i].name, kCalls[i]["function"]["name"].get<std::string>());
    EXPECT_EQ(ordered_json::parse(m.tool_calls[i].arguments),
              ordered_json::parse(kCalls[i]["function"]["arguments"].get<std::string>()));
  }
  const ParsedMessage chat = parse_completion("Hi there" + std::string(chat_tokens::eos), ThinkingMode::chat);
  EXPECT_EQ(chat.content, "Hi there");
  EXPECT_EQ(chat.to_json()["tool_calls"].size(), 0u);
}

TEST(ChatParser, StreamingEqualsOneShotForEveryChunking) {
  const std::string text = generated("Reasoning with </thi and <｜DSM bits", "Answer\n\nwith blank lines", kCalls);
  const ParsedMessage whole = parse_completion(text, ThinkingMode::thinking);
  std::mt19937 rng(1);
  for (int trial = 0; trial < 300; ++trial) {
    ChatStreamParser p(ThinkingMode::thinking);
    ParsedMessage streamed;
    const auto add = [&](const ChatStreamParser::Delta& d) {
      streamed.reasoning_content += d.reasoning_content;
      streamed.content += d.content;
      streamed.tool_calls.insert(streamed.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    };
    for (std::size_t pos = 0; pos < text.size();) {
      const std::size_t n = trial == 0 ? 1 : 1 + rng() % 12;  // trial 0: byte by byte
      add(p.push(std::string_view(text).substr(pos, n)));
      pos += n;
    }
    add(p.finish());
    ASSERT_EQ(streamed.reasoning_content, whole.reasoning_content);
    ASSERT_EQ(streamed.content, whole.content);
    ASSERT_EQ(streamed.tool_calls.size(), whole.tool_calls.size());
    for (std::size_t i = 0; i < whole.tool_calls.size(); ++i) ASSERT_EQ(streamed.tool_calls[i].arguments, whole.tool_calls[i].arguments);
  }
}

TEST(ChatParser, TruncatedGenerationsAreLenient) {
  const ParsedMessage r = parse_completion("still thinking", ThinkingMode::thinking);
  EXPECT_EQ(r.reasoning_content, "still thinking");
  EXPECT_FALSE(r.finished);
  EXPECT_EQ(parse_completion("partial answer", ThinkingMode::chat).content, "partial answer");
}

TEST(ChatParser, MalformedOutputIsAnError) {
  const std::string eos = chat_tokens::eos;
  EXPECT_THROW(parse_completion("a <think> b" + eos, ThinkingMode::chat), Error);
  EXPECT_THROW(parse_completion("done" + eos + "more", ThinkingMode::chat), Error);
  EXPECT_THROW(parse_completion("x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nam=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", ThinkingMode::chat), Error);
  EXPECT_THROW(parse_completion("x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n", ThinkingMode::chat), Error);
  EXPECT_THROW(parse_completion("r\n\n<｜DSML｜tool_calls>\n", ThinkingMode::thinking), Error);
}

}  // namespace
}  // namespace tern::tokenizer
