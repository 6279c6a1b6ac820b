// tern's tokenizer: byte-level BPE read from a Hugging Face tokenizer.json, giving the same ids as
// Hugging Face `tokenizers`, plus decoding (one-shot and streaming).
//
//   auto tok = tern::tokenizer::Tokenizer::from_file("tokenizer.json");
//   std::vector<TokenId> ids = tok.encode("Hello", /*add_special=*/false);
//   std::string text = tok.decode(ids, /*skip_special=*/false);
//
// Thread safety: a Tokenizer is immutable after loading; encode/decode may run on many threads at
// once (each thread keeps its own cache of encoded words).
//
// Errors (tern::Error): a malformed tokenizer.json names the file and the JSON path of the bad
// field; encode() rejects text that is not valid UTF-8 with the byte offset of the first bad
// byte; decode() rejects ids outside the vocabulary. Decoded bytes that are not valid UTF-8 become
// U+FFFD, one per maximal invalid sequence (as Hugging Face does).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocab.h"

namespace tern::tokenizer {

using TokenId = std::int32_t;

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  // `source` names the text in error messages.
  static Tokenizer from_json(std::string_view json_text, const std::string& source = "tokenizer.json");

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // add_special: apply the post-processor (e.g. a BOS from TemplateProcessing). Special tokens
  // written in the text are always recognised, as in Hugging Face.
  std::vector<TokenId> encode(std::string_view text, bool add_special = false) const;
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The token as tokenizer.json spells it (byte-level characters for BPE tokens).
  std::optional<std::string> id_to_token(TokenId id) const;
  // The raw bytes a token stands for in decoded text (may be part of a UTF-8 character).
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const;
  // One past the largest id.
  std::size_t vocab_size() const;
  const std::vector<AddedToken>& added_tokens() const;

  // Ids of DeepSeek's conventional special tokens, when the vocabulary has them.
  struct SpecialIds {
    std::optional<TokenId> bos, eos, user, assistant, think_begin, think_end;
  };
  const SpecialIds& special_ids() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming decoder: feed ids one at a time; each call returns only whole UTF-8 characters, holding
// back the bytes of a character a later token may complete. The concatenation of everything
// returned (finish() included) equals Tokenizer::decode of the same ids.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(TokenId id);
  // Ends the stream: held-back bytes that never completed a character become U+FFFD.
  std::string finish();
  // Bytes held back, waiting for the rest of a character.
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace tern::tokenizer
