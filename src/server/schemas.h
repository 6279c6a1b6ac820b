// Every JSON shape of the generation API: parsing requests into api_types.h (with OpenAI-style 400s
// naming the bad field) and rendering responses, stream chunks and the tokenizer endpoints' bodies. The
// shapes a front without an engine answers with too (errors, the model list) are in net/openai.h.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/bounded_json.h"
#include "engine/request.h"
#include "net/openai.h"
#include "server/api_types.h"

namespace tern::server {

// What one request may hold, field by field (docs/serving.md, "Limits"). The JSON limits hold for every
// field, the others for the fields they name.
struct ParseLimits {
  std::string model;        // the served model name; requests naming another get 404
  int64_t vocab_size = 0;
  JsonLimits json;          // nesting depth, string bytes, array items, members, values (every field)
  int max_n = 16;
  int max_top_logprobs = 20;
  size_t max_stop = 16;
  size_t max_prompts = 64;      // completions: prompts in one request
  size_t max_messages = 4096;   // chat: messages
  size_t max_tools = 128;       // chat: tools (OpenAI's limit)
  size_t max_tool_calls = 128;  // chat: tool calls of one message
  size_t max_name_bytes = 64;   // function names (OpenAI's limit)
  size_t max_label_bytes = 256; // model, user, tool_call_id, message names, tool call ids
};

CompletionRequest parse_completion(std::string_view body, const ParseLimits& limits);
ChatRequest parse_chat(std::string_view body, const ParseLimits& limits);
TokenizeRequest parse_tokenize(std::string_view body, const ParseLimits& limits);
DetokenizeRequest parse_detokenize(std::string_view body, const ParseLimits& limits);

// One choice's output (whole, or one stream chunk's delta).
struct ChoiceOut {
  int index = 0;
  std::string text;       // completions text / chat content
  std::string reasoning;  // chat reasoning_content
  std::vector<ToolCall> tool_calls;
  int tool_call_base = 0;  // stream: index of the first tool call in this delta
  bool logprobs = false;
  std::vector<engine::GeneratedToken> tokens;  // their logprobs, when `logprobs`
  std::optional<std::string> finish;           // finish_reason
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// The names the logprobs fields show for a token: its bytes (raw) and text (valid UTF-8).
using TokenBytes = std::function<std::string(int32_t)>;

struct ResponseHead {
  std::string id, model;
  int64_t created = 0;
};

std::string render_completion(const ResponseHead& head, const std::vector<ChoiceOut>& choices, const Usage& usage,
                              const TokenBytes& bytes);
std::string render_completion_chunk(const ResponseHead& head, const ChoiceOut& choice, const TokenBytes& bytes);
std::string render_chat(const ResponseHead& head, const std::vector<ChoiceOut>& choices, const Usage& usage,
                        const TokenBytes& bytes);
// `first`: the choice's first chunk, which carries the role together with its first content.
std::string render_chat_chunk(const ResponseHead& head, const ChoiceOut& choice, bool first, const TokenBytes& bytes);
// The final include_usage chunk (choices empty); `object` is text_completion or chat.completion.chunk.
std::string render_usage_chunk(const ResponseHead& head, const char* object, const Usage& usage);
std::string render_tokenize(const std::vector<int32_t>& tokens, int64_t max_model_len);
std::string render_detokenize(const std::string& text);

}  // namespace tern::server
