#include "engine/text_stream.h"

#include <algorithm>

namespace tern::engine {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Length of the valid UTF-8 character starting at s[i]: >0 valid, 0 invalid, -n incomplete (n bytes
// present and still a possible prefix).
int char_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) return -k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return 0;
  }
  return len;
}

}  // namespace

std::string sanitize_utf8(std::string_view bytes, bool final, size_t* tail) {
  std::string out;
  out.reserve(bytes.size());
  if (tail) *tail = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = char_length(bytes, i);
    if (len > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else if (len < 0 && !final) {
      if (tail) *tail = bytes.size() - i;
      break;
    } else {
      out.append(kReplacement);
      i += len < 0 ? static_cast<size_t>(-len) : 1;
    }
  }
  return out;
}

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::push(std::string_view bytes, bool* stopped) {
  *stopped = false;
  // Only a stop string overlapping the new bytes can be new: search from there.
  size_t longest = 0;
  for (const auto& s : stops_) longest = std::max(longest, s.size());
  const size_t from = held_.size() >= longest ? held_.size() - longest + 1 : 0;
  held_.append(bytes);
  size_t hit = std::string::npos;
  for (const auto& s : stops_) hit = std::min(hit, held_.find(s, from));
  if (hit != std::string::npos) {
    std::string out = sanitize_utf8(std::string_view(held_).substr(0, hit), true);
    held_.clear();
    *stopped = true;
    return out;
  }
  // Keep the longest tail that is a proper prefix of a stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  size_t tail = 0;
  std::string out = sanitize_utf8(std::string_view(held_).substr(0, held_.size() - keep), false, &tail);
  held_.erase(0, held_.size() - keep - tail);
  return out;
}

std::string TextStream::finish() {
  std::string out = sanitize_utf8(held_, true);
  held_.clear();
  return out;
}

}  // namespace tern::engine
