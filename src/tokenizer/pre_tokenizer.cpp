#include "tokenizer/pre_tokenizer.h"

#include "tokenizer/json_fields.h"

namespace tern::tokenizer {

using namespace json_fields;

namespace {

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior parse_behavior(const json& spec, const std::string& path) {
  const std::string p = child(path, "behavior");
  const std::string b = get_string(require(spec, "behavior", path), p);
  if (b == "Removed") return SplitBehavior::removed;
  if (b == "Isolated") return SplitBehavior::isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (b == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (b == "Contiguous") return SplitBehavior::contiguous;
  bad(p, "unknown behavior \"" + b + "\"");
}

void push_nonempty(std::vector<Span>& out, std::uint32_t begin, std::uint32_t end) {
  if (end > begin) out.push_back({begin, end});
}

}  // namespace

void apply_behavior(const std::vector<Cut>& cuts, SplitBehavior behavior, std::vector<Span>& out) {
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Cut& c : cuts) push_nonempty(out, c.begin, c.end);
      return;
    case SplitBehavior::removed:
      for (const Cut& c : cuts)
        if (!c.is_match) push_nonempty(out, c.begin, c.end);
      return;
    case SplitBehavior::contiguous:
    case SplitBehavior::merged_with_previous: {
      // Build with empty pieces kept, as Hugging Face does, and drop them at the end.
      std::vector<Span> acc;
      for (const Cut& c : cuts) {
        const bool merge = behavior == SplitBehavior::contiguous ? c.is_match == previous_match
                                                                 : c.is_match && !previous_match;
        if (merge && !acc.empty()) acc.back().end = c.end; else acc.push_back({c.begin, c.end});
        previous_match = c.is_match;
      }
      for (const Span& s : acc) push_nonempty(out, s.begin, s.end);
      return;
    }
    case SplitBehavior::merged_with_next: {
      std::vector<Span> acc;
      for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
        if (it->is_match && !previous_match && !acc.empty()) acc.back().begin = it->begin;
        else acc.push_back({it->begin, it->end});
        previous_match = it->is_match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) push_nonempty(out, it->begin, it->end);
      return;
    }
  }
}

struct PreTokenizer::Step {
  enum class Kind { regex, literal, digits } kind = Kind::regex;
  std::unique_ptr<Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;

  // The cuts of text[begin, end) with offsets relative to the whole text.
  void find_cuts(std::string_view text, Span span, std::vector<Cut>& cuts) const {
    cuts.clear();
    const std::string_view inside = text.substr(span.begin, span.end - span.begin);
    std::uint32_t prev = 0;
    const auto on_match = [&](std::size_t b, std::size_t e) {
      if (prev != b) cuts.push_back({span.begin + prev, span.begin + static_cast<std::uint32_t>(b), false});
      cuts.push_back({span.begin + static_cast<std::uint32_t>(b), span.begin + static_cast<std::uint32_t>(e), true});
      prev = static_cast<std::uint32_t>(e);
    };
    if (kind == Kind::regex) {
      regex->for_each_match(inside, on_match);
    } else if (kind == Kind::literal) {
      for (std::size_t pos = inside.find(literal); pos != std::string_view::npos;
           pos = inside.find(literal, pos + literal.size())) {
        on_match(pos, pos + literal.size());
      }
    } else {
      for (std::size_t i = 0; i < inside.size(); ++i)
        if (inside[i] >= '0' && inside[i] <= '9') on_match(i, i + 1);
    }
    if (prev != inside.size()) cuts.push_back({span.begin + prev, span.end, false});
    if (invert)
      for (Cut& c : cuts) c.is_match = !c.is_match;
  }
};

PreTokenizer::PreTokenizer(const json& spec, const std::string& path) {
  if (!spec.is_null()) add(spec, path, true);
}
PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::add(const json& spec, const std::string& path, bool last) {
  if (has_byte_level_) bad(path, "ByteLevel must be the last pre-tokenizer (tern's BPE works on bytes)");
  const std::string type = type_of(spec, path);
  auto step = std::make_unique<Step>();
  if (type == "Sequence") {
    const std::string list_path = child(path, "pretokenizers");
    const json& list = require(spec, "pretokenizers", path);
    if (!list.is_array()) bad(list_path, "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i) add(list[i], child(list_path, i), last && i + 1 == list.size());
    return;
  }
  if (type == "Split") {
    const std::string pattern_path = child(path, "pattern");
    const json& pattern = require(spec, "pattern", path);
    if (const json* re = optional(pattern, "Regex")) {
      step->regex = std::make_unique<Regex>(get_string(*re, child(pattern_path, "Regex")));
    } else if (const json* s = optional(pattern, "String")) {
      step->kind = Step::Kind::literal;
      step->literal = get_string(*s, child(pattern_path, "String"));
      if (step->literal.empty()) bad(child(pattern_path, "String"), "empty split string");
    } else {
      bad(pattern_path, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    step->behavior = parse_behavior(spec, path);
    step->invert = get_bool(spec, "invert", path, false);
  } else if (type == "Digits") {
    step->kind = Step::Kind::digits;
    step->behavior = get_bool(spec, "individual_digits", path, false) ? SplitBehavior::isolated
                                                                      : SplitBehavior::contiguous;
  } else if (type == "ByteLevel") {
    if (!last) bad(path, "ByteLevel must be the last pre-tokenizer (tern's BPE works on bytes)");
    has_byte_level_ = true;
    add_prefix_space_ = get_bool(spec, "add_prefix_space", path, true);
    if (add_prefix_space_ && !steps_.empty()) {
      bad(child(path, "add_prefix_space"), "supported only when ByteLevel is the only pre-tokenizer");
    }
    if (!get_bool(spec, "use_regex", path, true)) return;
    step->regex = std::make_unique<Regex>(kByteLevelPattern);
  } else {
    bad(child(path, "type"), "pre-tokenizer \"" + type + "\" is not supported (supported: Sequence, Split, Digits, ByteLevel)");
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::split(std::string_view text, std::vector<Span>& pieces) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back({0, static_cast<std::uint32_t>(text.size())});
  thread_local std::vector<Span> next;
  thread_local std::vector<Cut> cuts;
  for (const auto& step : steps_) {
    next.clear();
    for (const Span& span : pieces) {
      step->find_cuts(text, span, cuts);
      apply_behavior(cuts, step->behavior, next);
    }
    pieces.swap(next);
  }
}

}  // namespace tern::tokenizer
