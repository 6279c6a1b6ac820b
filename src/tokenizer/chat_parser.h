// The reverse of chat_encoding.h: DeepSeek-V4's generated text -> an assistant message with
// reasoning_content, content and tool_calls, by the rules of parse_message_from_completion_text in
// DeepSeek's encoding_dsv4.py. ChatStreamParser does the same incrementally for streaming; one-shot
// parse_completion() is the streaming parser fed everything at once, so both always agree.
//
// Text is what follows the prompt: in thinking mode it starts inside <think> (the prompt opened
// it). Tool calls are DSML blocks after a blank line; arguments come out as a JSON string.
// Malformed output (a special token inside content, a broken DSML block, text after the end of
// sentence) throws tern::Error, as the reference raises. Two leniencies, for truncated
// generations: the end-of-sentence token may be missing, and in thinking mode text that never
// reached </think> is all reasoning.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_encoding.h"

namespace tern::tokenizer {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;
  bool finished = false;  // the end-of-sentence token was seen

  // {"role": "assistant", "content", "reasoning_content", "tool_calls": [{"type": "function",
  // "function": {"name", "arguments"}}]} as the reference returns it.
  ordered_json to_json() const;
};

class ChatStreamParser {
 public:
  explicit ChatStreamParser(ThinkingMode mode);

  // What a chunk of generated text adds. Text that may be the start of a marker is held back until
  // it is decided; a tool call is reported once its invoke block is complete.
  struct Delta {
    std::string reasoning_content;
    std::string content;
    std::vector<ToolCall> tool_calls;
    bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  };
  Delta push(std::string_view text);
  // End of generation: releases what was held back.
  Delta finish();
  bool finished() const { return state_ == State::done; }

 private:
  enum class State { reasoning, content, tool_block, after_block, done };
  enum class Block { before_invoke, name, param, after_param };
  struct Stop {
    std::size_t pos;
    std::size_t index;  // which stop was found
  };
  void run(Delta& delta, bool at_end);
  bool step(Delta& delta, bool at_end);
  bool step_text(Delta& delta, bool at_end);
  bool step_block(Delta& delta, bool at_end);
  void emit_text(Delta& delta, std::string_view text);

  State state_;
  Block block_ = Block::before_invoke;
  std::string buffer_;
  std::string call_name_;
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> call_args_;  // name -> (value, is string)
};

ParsedMessage parse_completion(std::string_view text, ThinkingMode mode);

}  // namespace tern::tokenizer
