#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"

namespace tern::tokenizer {

using namespace json_fields;

namespace {

bool is_white_space(char32_t c) {
  for (const auto& [first, last] : *unicode::property_ranges("White_Space"))
    if (c >= first && c <= last) return true;
  return false;
}

// Rust's char::is_alphanumeric (letters and numbers) or '_', the word characters of single_word.
bool is_word_char(char32_t c) {
  if (c == '_') return true;
  for (const char* cat : {"L", "N"})
    for (const auto& [first, last] : *unicode::property_ranges(cat))
      if (c >= first && c <= last) return true;
  return false;
}

char32_t last_char(std::string_view text) {
  std::size_t pos = text.size() - 1;
  while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return unicode::decode_at(text, pos);
}

}  // namespace

AddedVocabulary::AddedVocabulary(const json& list, const std::string& path) {
  if (list.is_null()) return;
  if (!list.is_array()) bad(path, "expected an array, found " + type_name(list));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string p = child(path, i);
    const json& t = list[i];
    AddedToken token;
    const std::int64_t id = get_int(require(t, "id", p), child(p, "id"));
    if (id < 0 || id >= (1 << 30)) bad(child(p, "id"), "id out of range");
    token.id = static_cast<TokenId>(id);
    token.content = get_string(require(t, "content", p), child(p, "content"));
    if (token.content.empty()) bad(child(p, "content"), "an added token cannot be empty");
    if (unicode::find_invalid_utf8(token.content) != std::string_view::npos) bad(child(p, "content"), "not valid UTF-8");
    token.special = get_bool(t, "special", p, false);
    token.normalized = get_bool(t, "normalized", p, !token.special);
    token.lstrip = get_bool(t, "lstrip", p, false);
    token.rstrip = get_bool(t, "rstrip", p, false);
    token.single_word = get_bool(t, "single_word", p, false);
    (token.normalized ? normalized_ : raw_).insert(token.content, static_cast<std::int32_t>(tokens_.size()));
    tokens_.push_back(std::move(token));
  }
}

void AddedVocabulary::Matcher::insert(std::string_view s, std::int32_t token) {
  std::int32_t node = 0;
  first_byte[static_cast<unsigned char>(s[0])] = true;
  for (const char ch : s) {
    const auto b = static_cast<unsigned char>(ch);
    auto& kids = nodes[node].children;
    const auto it = std::find_if(kids.begin(), kids.end(), [b](const auto& kv) { return kv.first == b; });
    if (it != kids.end()) {
      node = it->second;
    } else {
      const auto next = static_cast<std::int32_t>(nodes.size());
      nodes[node].children.emplace_back(b, next);
      nodes.emplace_back();
      node = next;
    }
  }
  nodes[node].token = token;  // a duplicate content keeps the later entry
}

std::int32_t AddedVocabulary::Matcher::longest_at(std::string_view text, std::size_t pos, std::size_t& length) const {
  std::int32_t node = 0, best = -1;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& kids = nodes[node].children;
    const auto it = std::find_if(kids.begin(), kids.end(), [b](const auto& kv) { return kv.first == b; });
    if (it == kids.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      length = i + 1 - pos;
    }
  }
  return best;
}

void AddedVocabulary::split(std::string_view text, bool raw_pass, const std::function<void(std::string_view)>& on_text,
                            const std::function<void(TokenId)>& on_token) const {
  const Matcher& m = raw_pass ? raw_ : normalized_;
  std::size_t emitted = 0;  // text before this offset has been handed out
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (!m.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    std::size_t length = 0;
    const std::int32_t index = m.longest_at(text, pos, length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<std::size_t>(index)];
    std::size_t start = pos, stop = pos + length;
    if (token.single_word) {
      const bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      std::size_t after = stop;
      const bool stop_ok = stop == text.size() || !is_word_char(unicode::decode_at(text, after));
      if (!start_ok || !stop_ok) {
        pos += length;  // the matcher resumes after a rejected match, as Aho-Corasick does
        continue;
      }
    }
    if (token.lstrip) {
      while (start > emitted && is_white_space(last_char(text.substr(0, start)))) {
        do --start; while (start > emitted && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80);
      }
    }
    if (token.rstrip) {
      for (std::size_t after = stop; after < text.size();) {
        std::size_t next = after;
        if (!is_white_space(unicode::decode_at(text, next))) break;
        stop = after = next;
      }
    }
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    on_token(token.id);
    emitted = pos = stop;
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

}  // namespace tern::tokenizer
