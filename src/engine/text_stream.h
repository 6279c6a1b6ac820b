// The output text of one sequence as tokens arrive: matches stop strings across token boundaries
// (the stop string and everything after it are dropped), holds back bytes that may still start a stop
// string or finish a UTF-8 character, and releases only valid UTF-8 (invalid bytes become U+FFFD).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tern::engine {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {});
  // Appends one token's bytes; returns the text now safe to release. Sets *stopped when a stop string
  // completed (what preceded it is released; nothing more will be).
  std::string push(std::string_view bytes, bool* stopped);
  // The end of the output: releases whatever is held.
  std::string finish();

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

// Valid UTF-8 for `bytes`: each invalid or (when `final`) truncated sequence becomes U+FFFD. When not
// final, an incomplete character at the end is left out and its length stored in *tail.
std::string sanitize_utf8(std::string_view bytes, bool final, size_t* tail = nullptr);

}  // namespace tern::engine
