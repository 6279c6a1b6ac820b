// Regular expressions of tokenizer.json, written for Oniguruma (Hugging Face tokenizers' engine),
// run by PCRE2 with JIT. The pattern is translated once: \s, \d, \w and \h get Oniguruma's Unicode
// meanings, and \p{..} classes are widened with the characters Unicode 15.0 added over PCRE2's
// tables, so both engines split text the same way.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace tern::tokenizer {

class Regex {
 public:
  explicit Regex(std::string_view oniguruma_pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Calls fn(begin, end) for each match in `subject` (valid UTF-8) as Oniguruma's find_iter yields
  // them: left to right, an empty match right after the previous match is skipped.
  template <typename Fn>
  void for_each_match(std::string_view subject, Fn&& fn) const {
    std::size_t pos = 0;
    std::size_t last_match_end = std::string_view::npos;
    std::size_t begin = 0, end = 0;
    while (pos <= subject.size() && search(subject, pos, begin, end)) {
      if (begin == end && last_match_end == end) {
        if (pos == subject.size()) break;
        pos = next_char(subject, pos);
        continue;
      }
      pos = end;
      last_match_end = end;
      fn(begin, end);
    }
  }

  const std::string& translated_pattern() const;

 private:
  bool search(std::string_view subject, std::size_t start, std::size_t& begin, std::size_t& end) const;
  static std::size_t next_char(std::string_view subject, std::size_t pos);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Exposed for tests: the PCRE2 pattern an Oniguruma pattern becomes.
std::string translate_oniguruma_pattern(std::string_view pattern);

}  // namespace tern::tokenizer
