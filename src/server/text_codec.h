// What the server needs from the tokenizer: text <-> ids, the bytes each output token adds, the chat
// prompt for OpenAI messages, and a parser that splits chat output into content, reasoning and tool
// calls as it streams. tokenizer_codec.cpp implements it over tern_tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_types.h"

namespace tern::server {

struct ParsedDelta {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;  // complete calls, in order
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual ParsedDelta push(std::string_view text) = 0;
  virtual ParsedDelta finish() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The bytes a generated token adds to the output text ("" for special tokens).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::vector<int32_t> eos_ids() const = 0;
  virtual std::vector<int32_t> chat_prompt(const ChatRequest& request) const = 0;
  virtual std::unique_ptr<OutputParser> output_parser(const ChatRequest& request) const = 0;
};

// The codec over tern's tokenizer (tokenizer.json at `path`).
std::unique_ptr<TextCodec> make_tokenizer_codec(const std::string& path);

}  // namespace tern::server
