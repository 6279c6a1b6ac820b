// One chunk of an OpenAI-compatible stream (the `data` of a server-sent event, net/sse.h) as the
// benchmark reads it: content, usage, finish reason, errors.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tern::bench {

enum class Api { chat, completions };

struct ChunkInfo {
  bool done = false;           // the `[DONE]` sentinel
  bool has_content = false;    // carries generated text (content, reasoning, or completion text)
  std::size_t content_bytes = 0;
  std::optional<int> completion_tokens;  // from `usage`
  std::optional<int> prompt_tokens;
  std::string finish_reason;
  std::string error;           // non-empty: the server reported an error, or the chunk is malformed
  bool malformed = false;
};

ChunkInfo read_chunk(std::string_view data, Api api);

}  // namespace tern::bench
