// Server-sent events as OpenAI-compatible servers stream them: an incremental parser of the
// text/event-stream framing, and the reading of one chunk's JSON (content, usage, errors).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tern::bench {

// Feeds arbitrary byte pieces; returns the `data` of each event completed by a blank line
// (multi-line data joined with '\n', comments and other fields ignored, CRLF accepted).
class SseParser {
 public:
  void feed(std::string_view bytes, std::vector<std::string>& events);
  // At end of stream: an event that was not terminated by a blank line, if any.
  std::optional<std::string> flush();
  std::size_t buffered() const { return line_.size() + data_.size(); }

 private:
  void end_line(std::vector<std::string>& events);
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

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
