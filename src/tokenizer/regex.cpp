#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tern::tokenizer {
namespace {

using unicode::Ranges;

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

// Characters PCRE2's tables (Unicode 14) leave unassigned but Unicode 15.0 assigns, grouped by
// their utf8proc general category; they are appended to each \p{..} class that should hold them.
const std::map<std::string, Ranges, std::less<>>& unicode15_additions() {
  static const auto additions = [] {
    std::map<std::string, Ranges, std::less<>> by_category;
    std::string assigned;
    const Ranges* unassigned = unicode::property_ranges("Cn");
    char32_t cp = 0;
    auto emit_until = [&](char32_t stop) {
      for (; cp < stop; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        unicode::append_utf8(assigned, cp);
      }
    };
    for (const auto& [first, last] : *unassigned) {
      emit_until(first);
      cp = last + 1;
    }
    emit_until(0x110000);
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{Cn}"), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF, &err, &off, nullptr);
    TERN_CHECK(code != nullptr, "PCRE2 cannot compile \\p{Cn}: ", pcre2_message(err));
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    PCRE2_SIZE start = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(assigned.data());
    while (pcre2_match(code, subject, assigned.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr) >= 0) {
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      std::size_t pos = ov[0];
      const char32_t c = unicode::decode_at(assigned, pos);
      start = pos;
      for (const char* name : {"L", "M", "N", "P", "S", "Z", "C"}) {
        for (const auto& [first, last] : *unicode::property_ranges(name)) {
          if (c >= first && c <= last) {
            auto& r = by_category[name];
            if (!r.empty() && r.back().second + 1 == c) r.back().second = c; else r.emplace_back(c, c);
          }
        }
      }
    }
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return by_category;
  }();
  return additions;
}

void append_ranges(std::string& out, const Ranges& ranges) {
  char buf[48];
  for (const auto& [first, last] : ranges) {
    if (first == last) {
      std::snprintf(buf, sizeof buf, "\\x{%X}", static_cast<unsigned>(first));
    } else {
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(first),
                    static_cast<unsigned>(last));
    }
    out += buf;
  }
}

std::string canonical_property(std::string_view name) {
  static const std::map<std::string_view, std::string_view> long_names = {
      {"Letter", "L"}, {"Mark", "M"}, {"Number", "N"}, {"Punctuation", "P"}, {"Symbol", "S"},
      {"Separator", "Z"}, {"Other", "C"}, {"Decimal_Number", "Nd"}, {"Uppercase_Letter", "Lu"},
      {"Lowercase_Letter", "Ll"}, {"Space_Separator", "Zs"}};
  const auto it = long_names.find(name);
  return std::string(it == long_names.end() ? name : it->second);
}

// The body of a character class (without brackets) for property `name`: PCRE2's own \p{..}
// plus the Unicode 15.0 additions of that category.
std::string property_body(const std::string& name) {
  std::string body = "\\p{" + name + "}";
  const auto& additions = unicode15_additions();
  if (name.size() == 1) {
    if (const auto it = additions.find(name); it != additions.end()) append_ranges(body, it->second);
  } else if (name.size() == 2) {
    // Two-letter category: only the additions whose own category matches.
    if (const auto* exact = unicode::property_ranges(name)) {
      if (const auto it = additions.find(name.substr(0, 1)); it != additions.end()) {
        Ranges keep;
        for (const auto& [f, l] : it->second)
          for (const auto& [ef, el] : *exact)
            if (f <= el && ef <= l) keep.emplace_back(std::max(f, ef), std::min(l, el));
        append_ranges(body, keep);
      }
    }
  }
  return body;
}

// Oniguruma's Unicode meaning of a shorthand class, as a class body.
std::string shorthand_body(char c) {
  switch (c) {
    case 's': {
      std::string b;
      append_ranges(b, *unicode::property_ranges("White_Space"));
      return b;
    }
    case 'd': return property_body("Nd");
    case 'w': return property_body("L") + property_body("M") + property_body("Nd") + property_body("Pc");
    case 'h': return "0-9a-fA-F";
    default: return {};
  }
}

std::size_t utf8_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace

std::string translate_oniguruma_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  std::size_t class_start = 0;
  for (std::size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if ((e == 'p' || e == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
        const std::size_t close = p.find('}', i + 3);
        TERN_CHECK(close != std::string_view::npos, "unterminated \\p{ in regex: ", p);
        std::string name(p.substr(i + 3, close - i - 3));
        bool negated = e == 'P';
        if (!name.empty() && name[0] == '^') negated = !negated, name.erase(0, 1);
        name = canonical_property(name);
        if (in_class) {
          out += negated ? "\\P{" + name + "}" : property_body(name);
        } else {
          out += (negated ? "[^" : "[") + property_body(name) + "]";
        }
        i = close + 1;
        continue;
      }
      const char lower = static_cast<char>(e | 0x20);
      if (e == 's' || e == 'S' || e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 'h' || e == 'H') {
        const bool negated = e != lower;
        const std::string body = shorthand_body(lower);
        if (in_class) {
          TERN_CHECK(!negated, "regex: negated \\", e, " inside a character class is not supported: ", p);
          out += body;
        } else {
          out += (negated ? "[^" : "[") + body + "]";
        }
        i += 2;
        continue;
      }
      if (e == 'u' && i + 6 <= p.size()) {
        out += "\\x{" + std::string(p.substr(i + 2, 4)) + "}";
        i += 6;
        continue;
      }
      const std::size_t len = utf8_len(static_cast<unsigned char>(e));
      out.append(p.substr(i, 1 + len));
      i += 1 + len;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      class_start = i;
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[' && (i + 1 >= p.size() || p[i + 1] != ':')) {
      fail("regex: nested character classes (Oniguruma set operations) are not supported: ", p);
    }
    if (in_class && c == ']' && i > class_start) in_class = false;
    const std::size_t len = utf8_len(static_cast<unsigned char>(c));
    out.append(p.substr(i, len));
    i += len;
  }
  return out;
}

struct Regex::Impl {
  std::string pattern;
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

namespace {

// One match data block and JIT stack per thread, shared by all patterns (each match call is
// self-contained).
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

Regex::Regex(std::string_view oniguruma_pattern) : impl_(std::make_unique<Impl>()) {
  impl_->pattern = translate_oniguruma_pattern(oniguruma_pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(impl_->pattern.data()), impl_->pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  TERN_CHECK(impl_->code != nullptr, "regex does not compile (", pcre2_message(err), " at offset ", offset,
             "): ", oniguruma_pattern);
  const int jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
  TERN_CHECK(jit == 0, "PCRE2 JIT is unavailable (", pcre2_message(jit), "); tern needs it for speed");
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

const std::string& Regex::translated_pattern() const { return impl_->pattern; }

bool Regex::search(std::string_view subject, std::size_t start, std::size_t& begin, std::size_t& end) const {
  ThreadMatchState& st = thread_state();
  const int rc = pcre2_jit_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                                 start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  TERN_CHECK(rc >= 0, "regex match failed: ", pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  begin = ov[0];
  end = ov[1];
  return true;
}

std::size_t Regex::next_char(std::string_view subject, std::size_t pos) {
  return pos + utf8_len(static_cast<unsigned char>(subject[pos]));
}

}  // namespace tern::tokenizer
