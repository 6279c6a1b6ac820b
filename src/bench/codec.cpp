#include "bench/codec.h"

#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace tern::bench {
namespace {

// Word i is spelled from i in base 26 with a fixed prefix letter per length bucket, so every word
// is distinct, has no spaces, and encode can invert decode with one hash lookup.
class SyntheticCodec final : public TokenCodec {
 public:
  explicit SyntheticCodec(std::size_t size) {
    words_.reserve(size);
    for (std::size_t i = 0; i < size; ++i) words_.push_back(spell(i));
    for (std::size_t i = 0; i < size; ++i) index_.emplace(words_[i], static_cast<TokenId>(i));
  }

  std::vector<TokenId> encode(std::string_view text) const override {
    std::vector<TokenId> ids;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t end = text.find(' ', pos);
      if (end == std::string_view::npos) end = text.size();
      if (end > pos) {
        auto it = index_.find(std::string(text.substr(pos, end - pos)));
        // An unknown word counts as one token: lengths stay meaningful for arbitrary text.
        ids.push_back(it == index_.end() ? 0 : it->second);
      }
      pos = end + 1;
    }
    return ids;
  }

  std::string decode(std::span<const TokenId> ids) const override {
    std::string out;
    for (TokenId id : ids) {
      TERN_CHECK(id >= 0 && static_cast<std::size_t>(id) < words_.size(), "synthetic codec: id ", id,
                 " outside the vocabulary of ", words_.size());
      if (!out.empty()) out += ' ';
      out += words_[static_cast<std::size_t>(id)];
    }
    return out;
  }

  std::size_t vocab_size() const override { return words_.size(); }
  std::string describe() const override {
    return cat("synthetic vocabulary of ", words_.size(), " words (lengths approximate on a real server)");
  }

 private:
  static std::string spell(std::size_t i) {
    std::string w(1, "bdfgklmnprstvz"[i % 14]);
    for (std::size_t v = i / 14 + 1; v > 0; v /= 26) w += static_cast<char>('a' + v % 26);
    return w;
  }
  std::vector<std::string> words_;
  std::unordered_map<std::string, TokenId> index_;
};

}  // namespace

std::unique_ptr<TokenCodec> make_synthetic_codec(std::size_t size) {
  TERN_CHECK(size > 0, "synthetic codec: vocabulary size must be positive");
  return std::make_unique<SyntheticCodec>(size);
}

#ifndef TERN_BENCH_HAS_TOKENIZER
std::unique_ptr<TokenCodec> make_tokenizer_codec(const std::string& tokenizer_json) {
  fail("tern bench: --tokenizer ", tokenizer_json,
       " needs tern's tokenizer, which this build lacks (src/tokenizer was not built)");
}
#endif

std::unique_ptr<TokenCodec> make_codec(const std::string& path) {
  return path.empty() ? make_synthetic_codec() : make_tokenizer_codec(path);
}

}  // namespace tern::bench
