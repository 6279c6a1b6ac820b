// UTF-8 helpers and Unicode tables shared by the tokenizer: strict validation, the lossy decoding
// that Hugging Face tokenizers uses for byte-level output (Rust's String::from_utf8_lossy), and
// normalization through utf8proc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tern::tokenizer::unicode {

// Offset of the first byte that is not part of a well-formed UTF-8 sequence, or npos when the whole
// text is valid (no overlongs, no surrogates, nothing above U+10FFFF).
std::size_t find_invalid_utf8(std::string_view text);

// What the bytes at the front of a buffer are: a whole character (length = its size), the start of a
// character that more bytes may complete (length = bytes present), or invalid (length = the maximal
// subpart that one U+FFFD replaces, as Rust and the Unicode standard count it).
enum class SeqKind { complete, incomplete, invalid };
struct Seq {
  SeqKind kind;
  std::size_t length;
};
Seq next_sequence(const unsigned char* bytes, std::size_t size);

// Appends `bytes` to `out` replacing each maximal invalid subpart with U+FFFD. With `final_chunk`
// false, an incomplete character at the end is left unconsumed; the return value is the number of
// bytes consumed.
std::size_t append_lossy(std::string& out, std::string_view bytes, bool final_chunk = true);
std::string lossy(std::string_view bytes);

// Decodes the character at text[pos] (text must be valid UTF-8) and advances pos.
char32_t decode_at(std::string_view text, std::size_t& pos);
void append_utf8(std::string& out, char32_t cp);

enum class Form { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view text, Form form);

// Code point ranges [first, last] with a property, from utf8proc's Unicode data (15.0, the version
// of Oniguruma inside Hugging Face tokenizers). Names: general categories (L, Lu, N, Nd, P, ...,
// and long forms such as Letter), plus "White_Space".
using Ranges = std::vector<std::pair<char32_t, char32_t>>;
const Ranges* property_ranges(std::string_view name);

}  // namespace tern::tokenizer::unicode
