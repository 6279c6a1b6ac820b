// TextCodec over tern_tokenizer: ids, bytes, the DeepSeek-V4 chat encoding and its streaming output
// parser (reasoning_content, DSML tool calls).
#include <atomic>

#include "core/error.h"
#include "core/log.h"
#include "server/text_codec.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/chat_parser.h"
#include "tokenizer/tokenizer.h"

namespace tern::server {

namespace {

using tokenizer::Tokenizer;

std::string next_call_id() {
  static std::atomic<uint64_t> n{1};
  return cat("call_", std::hex, 0x7e5a11ull * 1000003 + n++);
}

// The tokenizer's parser, made total: output it cannot parse (a model writing noise) is passed on
// as content from there on, instead of failing the request.
class StreamParser : public OutputParser {
 public:
  explicit StreamParser(tokenizer::ThinkingMode mode) : parser_(mode) {}
  ParsedDelta push(std::string_view text) override {
    if (broken_) return content_only(text);
    try {
      return convert(parser_.push(text));
    } catch (const Error& e) {
      log::debug("chat output parser gave up: ", e.what());
      broken_ = true;
      return content_only(text);
    }
  }
  ParsedDelta finish() override {
    if (broken_) return {};
    try {
      return convert(parser_.finish());
    } catch (const Error&) {
      return {};
    }
  }

 private:
  static ParsedDelta content_only(std::string_view text) {
    ParsedDelta d;
    d.content = std::string(text);
    return d;
  }
  static ParsedDelta convert(tokenizer::ChatStreamParser::Delta&& in) {
    ParsedDelta d;
    d.content = std::move(in.content);
    d.reasoning = std::move(in.reasoning_content);
    for (auto& c : in.tool_calls) d.tool_calls.push_back({next_call_id(), std::move(c.name), std::move(c.arguments)});
    return d;
  }
  tokenizer::ChatStreamParser parser_;
  bool broken_ = false;
};

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(const std::string& path) : tok_(Tokenizer::from_file(path)) {
    const auto& s = tok_.special_ids();
    TERN_CHECK(s.eos, path, ": the vocabulary has no end-of-sentence token");
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(tok_.vocab_size()); }
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    return tok_.encode(text, add_special);
  }
  std::string decode(std::span<const int32_t> ids) const override { return tok_.decode(ids, true); }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || tok_.is_special(id)) return {};
    return std::string(tok_.token_bytes(id));
  }
  std::vector<int32_t> eos_ids() const override { return {*tok_.special_ids().eos}; }

  std::vector<int32_t> chat_prompt(const ChatRequest& r) const override {
    tokenizer::ChatOptions options;
    options.thinking_mode = mode(r);
    if (!r.reasoning_effort.empty() && r.reasoning_effort != "none") options.reasoning_effort = r.reasoning_effort;
    const auto messages = tokenizer::ordered_json::parse(r.messages_json);
    const auto tools = r.tools_json.empty() ? tokenizer::ordered_json() : tokenizer::ordered_json::parse(r.tools_json);
    return tok_.encode(tokenizer::encode_chat(messages, options, tools), false);
  }

  std::unique_ptr<OutputParser> output_parser(const ChatRequest& r) const override {
    return std::make_unique<StreamParser>(mode(r));
  }

 private:
  // Chat (non-thinking) mode unless the request asks for thinking.
  static tokenizer::ThinkingMode mode(const ChatRequest& r) {
    const bool thinking = r.thinking ? *r.thinking : !r.reasoning_effort.empty() && r.reasoning_effort != "none";
    return thinking ? tokenizer::ThinkingMode::thinking : tokenizer::ThinkingMode::chat;
  }
  Tokenizer tok_;
};

}  // namespace

std::unique_ptr<TextCodec> make_tokenizer_codec(const std::string& path) {
  return std::make_unique<TokenizerCodec>(path);
}

}  // namespace tern::server
