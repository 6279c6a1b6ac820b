// GPT-2's byte-level alphabet: every byte is shown as one printable character, so that BPE
// vocabularies can be written as text. tern works on raw bytes internally and uses this only to
// read vocabularies and to print tokens.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tern::tokenizer::byte_level {

// The character that stands for byte b.
char32_t char_of_byte(unsigned char b);

// The byte a character stands for, if it is one of the 256 alphabet characters.
std::optional<unsigned char> byte_of_char(char32_t c);

// The raw bytes a byte-level token string stands for; nullopt when a character is outside the
// alphabet (such tokens are plain text, e.g. `<｜User｜>`).
std::optional<std::string> to_bytes(std::string_view token);

// The byte-level spelling of raw bytes.
std::string from_bytes(std::string_view bytes);

}  // namespace tern::tokenizer::byte_level
