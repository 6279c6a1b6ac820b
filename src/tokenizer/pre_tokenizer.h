// tokenizer.json "pre_tokenizer": cuts normalized text into the pieces BPE encodes one by one.
// Supported: Sequence, Split (regex or string; every behavior; invert), Digits, and ByteLevel
// (with or without its GPT-2 regex), which must come last since tern's BPE works on raw bytes.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace tern::tokenizer {

struct Span {
  std::uint32_t begin;
  std::uint32_t end;
};

// A cut as Hugging Face's NormalizedString::split sees it: a stretch of text and whether the
// pattern matched it.
struct Cut {
  std::uint32_t begin;
  std::uint32_t end;
  bool is_match;
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

class PreTokenizer {
 public:
  PreTokenizer();
  // `spec` may be null (the whole text is one piece).
  PreTokenizer(const nlohmann::json& spec, const std::string& path);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // ByteLevel's add_prefix_space: the caller prepends a space to text that lacks one.
  bool adds_prefix_space() const { return add_prefix_space_; }
  bool has_byte_level() const { return has_byte_level_; }

  // Replaces `pieces` with the pieces of `text` (valid UTF-8), in order, none empty.
  void split(std::string_view text, std::vector<Span>& pieces) const;

 private:
  struct Step;
  void add(const nlohmann::json& spec, const std::string& path, bool last);
  std::vector<std::unique_ptr<Step>> steps_;
  bool add_prefix_space_ = false;
  bool has_byte_level_ = false;
};

// Exposed for tests: applies a behavior to the cuts of one piece starting at `offset`.
void apply_behavior(const std::vector<Cut>& cuts, SplitBehavior behavior, std::vector<Span>& out);

}  // namespace tern::tokenizer
