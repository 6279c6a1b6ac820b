#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <memory>

#include "core/error.h"

namespace tern::tokenizer::unicode {
namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// Valid range of the second byte for each lead byte (Unicode Table 3-7); later bytes are 80..BF.
std::pair<unsigned char, unsigned char> second_byte_range(unsigned char lead) {
  switch (lead) {
    case 0xE0: return {0xA0, 0xBF};
    case 0xED: return {0x80, 0x9F};
    case 0xF0: return {0x90, 0xBF};
    case 0xF4: return {0x80, 0x8F};
    default: return {0x80, 0xBF};
  }
}

std::size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

Seq next_sequence(const unsigned char* bytes, std::size_t size) {
  const std::size_t need = sequence_length(bytes[0]);
  if (need == 0) return {SeqKind::invalid, 1};
  if (need == 1) return {SeqKind::complete, 1};
  const auto [lo, hi] = second_byte_range(bytes[0]);
  for (std::size_t i = 1; i < need; ++i) {
    if (i >= size) return {SeqKind::incomplete, size};
    const unsigned char b = bytes[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return {SeqKind::invalid, i};
  }
  return {SeqKind::complete, need};
}

std::size_t find_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {  // ASCII fast path, 8 bytes at a time
      while (i + 8 <= n) {
        std::uint64_t w;
        __builtin_memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ULL) break;
        i += 8;
      }
      while (i < n && p[i] < 0x80) ++i;
      continue;
    }
    const Seq s = next_sequence(p + i, n - i);
    if (s.kind != SeqKind::complete) return i;
    i += s.length;
  }
  return std::string_view::npos;
}

std::size_t append_lossy(std::string& out, std::string_view bytes, bool final_chunk) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  while (i < n) {
    const Seq s = next_sequence(p + i, n - i);
    if (s.kind == SeqKind::complete) {
      out.append(bytes.data() + i, s.length);
    } else if (s.kind == SeqKind::incomplete && !final_chunk) {
      return i;
    } else {
      out.append(kReplacement);
    }
    i += s.length;
  }
  return i;
}

std::string lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_lossy(out, bytes, true);
  return out;
}

char32_t decode_at(std::string_view text, std::size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const std::size_t len = sequence_length(p[0]);
  char32_t cp = len == 1 ? p[0] : len == 2 ? (p[0] & 0x1F) : len == 3 ? (p[0] & 0x0F) : (p[0] & 0x07);
  for (std::size_t i = 1; i < len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  pos += len == 0 ? 1 : len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Characters whose compatibility decomposition is newer than the Unicode tables of Hugging Face
// tokenizers (unicode-normalization-alignments): NFKC/NFKD leave them unchanged there, so tern
// does too. Found by comparing both on every code point (tests/tokenizer/pyref).
constexpr std::pair<char32_t, char32_t> kNoCompatDecomposition[] = {
    {0x32FF, 0x32FF},   {0xA7F2, 0xA7F4},   {0xAB69, 0xAB69},   {0x10781, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x1E030, 0x1E06D}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9}};

// Characters with a canonical combining class that Hugging Face's tables lack (they count as
// starters there, so no reordering happens around them). Found by probing every code point after
// U+0345 in both implementations.
constexpr std::pair<char32_t, char32_t> kNoCombiningClass[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},     {0xC3C, 0xC3C},
    {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
    {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF}};

template <std::size_t N>
bool in_table(const std::pair<char32_t, char32_t> (&table)[N], char32_t cp) {
  for (const auto& [first, last] : table)
    if (cp >= first && cp <= last) return true;
  return false;
}

// Characters normalization must leave alone to agree with Hugging Face.
bool kept_as_is(char32_t cp, Form form) {
  if (in_table(kNoCombiningClass, cp)) return true;
  return (form == Form::nfkc || form == Form::nfkd) && in_table(kNoCompatDecomposition, cp);
}

std::string utf8proc_normalize(std::string_view text, Form form);

}  // namespace

std::string normalize(std::string_view text, Form form) {
  std::string out;
  std::size_t segment = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t at = pos;
    if (static_cast<unsigned char>(text[pos]) < 0xDF) {  // every kept character is U+07FD or above
      ++pos;
      continue;
    }
    if (!kept_as_is(decode_at(text, pos), form)) continue;
    out += utf8proc_normalize(text.substr(segment, at - segment), form);
    out.append(text.substr(at, pos - at));
    segment = pos;
  }
  out += utf8proc_normalize(text.substr(segment), form);
  return out;
}

namespace {

std::string utf8proc_normalize(std::string_view text, Form form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Form::nfc: options |= UTF8PROC_COMPOSE; break;
    case Form::nfd: options |= UTF8PROC_DECOMPOSE; break;
    case Form::nfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::nfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &result,
                              static_cast<utf8proc_option_t>(options));
  TERN_CHECK(n >= 0, "unicode normalization failed: ", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<std::size_t>(n));
}

}  // namespace

namespace {

constexpr std::array<const char*, 30> kCategoryNames = {
    "Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};

void add_range(Ranges& r, char32_t cp) {
  if (!r.empty() && r.back().second + 1 == cp) {
    r.back().second = cp;
  } else {
    r.emplace_back(cp, cp);
  }
}

// Generated by tests/tokenizer/pyref/unicode_tables.py: code points whose general category major
// class (or Nd) Oniguruma in Hugging Face tokenizers knows and utf8proc does not.
struct Addition {
  char32_t first, last;
  const char* cls;
};
constexpr Addition kOnigurumaAdditions[] = {
    {0x1C89, 0x1C8A, "L"},
    {0xA7CB, 0xA7CD, "L"},
    {0xA7DA, 0xA7DC, "L"},
    {0x105C0, 0x105F3, "L"},
    {0x10D4A, 0x10D65, "L"},
    {0x10D6F, 0x10D85, "L"},
    {0x10EC2, 0x10EC4, "L"},
    {0x11380, 0x11389, "L"},
    {0x1138B, 0x1138B, "L"},
    {0x1138E, 0x1138E, "L"},
    {0x11390, 0x113B5, "L"},
    {0x113B7, 0x113B7, "L"},
    {0x113D1, 0x113D1, "L"},
    {0x113D3, 0x113D3, "L"},
    {0x11BC0, 0x11BE0, "L"},
    {0x13460, 0x143FA, "L"},
    {0x16100, 0x1611D, "L"},
    {0x16D40, 0x16D6C, "L"},
    {0x18CFF, 0x18CFF, "L"},
    {0x1E5D0, 0x1E5ED, "L"},
    {0x1E5F0, 0x1E5F0, "L"},
    {0x2EBF0, 0x2EE5D, "L"},
    {0x897, 0x897, "M"},
    {0x10D69, 0x10D6D, "M"},
    {0x10EFC, 0x10EFC, "M"},
    {0x113B8, 0x113C0, "M"},
    {0x113C2, 0x113C2, "M"},
    {0x113C5, 0x113C5, "M"},
    {0x113C7, 0x113CA, "M"},
    {0x113CC, 0x113D0, "M"},
    {0x113D2, 0x113D2, "M"},
    {0x113E1, 0x113E2, "M"},
    {0x11F5A, 0x11F5A, "M"},
    {0x1611E, 0x1612F, "M"},
    {0x1E5EE, 0x1E5EF, "M"},
    {0x10D40, 0x10D49, "N"},
    {0x116D0, 0x116E3, "N"},
    {0x11BF0, 0x11BF9, "N"},
    {0x16130, 0x16139, "N"},
    {0x16D70, 0x16D79, "N"},
    {0x1CCF0, 0x1CCF9, "N"},
    {0x1E5F1, 0x1E5FA, "N"},
    {0x10D40, 0x10D49, "Nd"},
    {0x116D0, 0x116E3, "Nd"},
    {0x11BF0, 0x11BF9, "Nd"},
    {0x16130, 0x16139, "Nd"},
    {0x16D70, 0x16D79, "Nd"},
    {0x1CCF0, 0x1CCF9, "Nd"},
    {0x1E5F1, 0x1E5FA, "Nd"},
    {0x1B4E, 0x1B4F, "P"},
    {0x1B7F, 0x1B7F, "P"},
    {0x10D6E, 0x10D6E, "P"},
    {0x113D4, 0x113D5, "P"},
    {0x113D7, 0x113D8, "P"},
    {0x11BE1, 0x11BE1, "P"},
    {0x16D6D, 0x16D6F, "P"},
    {0x1E5FF, 0x1E5FF, "P"},
    {0x2427, 0x2429, "S"},
    {0x2FFC, 0x2FFF, "S"},
    {0x31E4, 0x31E5, "S"},
    {0x31EF, 0x31EF, "S"},
    {0x10D8E, 0x10D8F, "S"},
    {0x1CC00, 0x1CCEF, "S"},
    {0x1CD00, 0x1CEB3, "S"},
    {0x1F8B2, 0x1F8BB, "S"},
    {0x1F8C0, 0x1F8C1, "S"},
    {0x1FA89, 0x1FA89, "S"},
    {0x1FA8F, 0x1FA8F, "S"},
    {0x1FABE, 0x1FABE, "S"},
    {0x1FAC6, 0x1FAC6, "S"},
    {0x1FADC, 0x1FADC, "S"},
    {0x1FADF, 0x1FADF, "S"},
    {0x1FAE9, 0x1FAE9, "S"},
    {0x1FBCB, 0x1FBEF, "S"},
};
const std::map<std::string, std::string> kDefaultSubcategory = {
    {"L", "o"}, {"M", "n"}, {"N", "o"}, {"P", "o"}, {"S", "o"}, {"Z", "s"}};

std::map<std::string, Ranges, std::less<>> build_tables() {
  std::map<std::string, Ranges, std::less<>> t;
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    const auto cat = static_cast<std::size_t>(utf8proc_category(static_cast<utf8proc_int32_t>(cp)));
    const std::string two = kCategoryNames.at(cat);
    add_range(t[two], cp);
    add_range(t[two.substr(0, 1)], cp);
  }
  // Characters Oniguruma (Unicode 16.0) classifies and utf8proc (15.0) leaves unassigned.
  for (const auto& [first, last, cls] : kOnigurumaAdditions) {
    for (auto* r : {&t["Cn"], &t["C"]}) {
      Ranges kept;
      for (const auto& [f, l] : *r) {
        if (l < first || f > last) { kept.emplace_back(f, l); continue; }
        if (f < first) kept.emplace_back(f, first - 1);
        if (l > last) kept.emplace_back(last + 1, l);
      }
      *r = std::move(kept);
    }
    const std::string name = cls;
    const std::string two = name.size() == 2 ? name : name + kDefaultSubcategory.at(name);
    for (const std::string& n : {name, two}) {
      Ranges& r = t[n];
      r.emplace_back(first, last);
      std::sort(r.begin(), r.end());
    }
  }
  t["White_Space"] = {{0x09, 0x0D}, {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                      {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                      {0x205F, 0x205F}, {0x3000, 0x3000}};
  const std::pair<const char*, const char*> aliases[] = {
      {"Letter", "L"}, {"Mark", "M"},         {"Number", "N"},          {"Punctuation", "P"},
      {"Symbol", "S"}, {"Separator", "Z"},    {"Other", "C"},           {"Uppercase_Letter", "Lu"},
      {"Lowercase_Letter", "Ll"},             {"Decimal_Number", "Nd"}, {"Space_Separator", "Zs"}};
  for (const auto& [alias, name] : aliases) t[alias] = t[name];
  return t;
}

}  // namespace

const Ranges* property_ranges(std::string_view name) {
  static const auto tables = build_tables();
  const auto it = tables.find(name);
  return it == tables.end() ? nullptr : &it->second;
}

}  // namespace tern::tokenizer::unicode
