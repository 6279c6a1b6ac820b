// Server-sent events: an incremental parser of the text/event-stream framing, for the clients of
// OpenAI-compatible streams (the router relaying a server's stream, the benchmark client).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tern::net {

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

}  // namespace tern::net
