// The tokenizer seam of tern bench: prompts are built from token ids and measured in tokens, so
// the workload needs encode/decode. tern's own tokenizer plugs in when it is built
// (tern_codec.cpp); otherwise a synthetic vocabulary stands in and the report says so.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern::bench {

using TokenId = std::int32_t;

class TokenCodec {
 public:
  virtual ~TokenCodec() = default;
  virtual std::vector<TokenId> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const TokenId> ids) const = 0;
  // Ids in [0, vocab_size) that random prompts may draw from.
  virtual std::size_t vocab_size() const = 0;
  // Is `id` an ordinary token (random prompts skip special ones)?
  virtual bool is_plain(TokenId id) const { return true; }
  // For the report: which tokenizer built the prompts.
  virtual std::string describe() const = 0;
};

// A deterministic vocabulary of `size` space-separated pseudo-words: decode(encode(x)) == x and
// lengths are exact against itself, but only approximate on a real server.
std::unique_ptr<TokenCodec> make_synthetic_codec(std::size_t size = 32000);

// tern's tokenizer read from a tokenizer.json; throws tern::Error when tern was built without it.
std::unique_ptr<TokenCodec> make_tokenizer_codec(const std::string& tokenizer_json);

// `path` empty: the synthetic codec; otherwise the tokenizer.json at `path`.
std::unique_ptr<TokenCodec> make_codec(const std::string& path);

}  // namespace tern::bench
