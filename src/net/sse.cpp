#include "net/sse.h"

namespace tern::net {

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the LF of a CRLF pair: the CR already ended the line
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = (c == '\r');
    if (c == '\n' || c == '\r') end_line(events);
    else line_ += c;
  }
}

void SseParser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {  // a blank line dispatches the event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_.front() != ':') {  // ':' starts a comment
    std::size_t colon = line_.find(':');
    std::string_view field = std::string_view(line_).substr(0, colon);
    std::string_view value;
    if (colon != std::string::npos) {
      value = std::string_view(line_).substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

std::optional<std::string> SseParser::flush() {
  std::vector<std::string> events;
  if (!line_.empty()) end_line(events);
  end_line(events);
  if (events.empty()) return std::nullopt;
  return std::move(events.front());
}

}  // namespace tern::net
