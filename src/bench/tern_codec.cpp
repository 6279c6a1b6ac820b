// Adapter from tern's tokenizer to the bench codec (compiled only when tern_tokenizer exists).
#include "bench/codec.h"
#include "tokenizer/tokenizer.h"

namespace tern::bench {
namespace {

class TernCodec final : public TokenCodec {
 public:
  TernCodec(tokenizer::Tokenizer tok, std::string path) : tok_(std::move(tok)), path_(std::move(path)) {}
  std::vector<TokenId> encode(std::string_view text) const override { return tok_.encode(text); }
  std::string decode(std::span<const TokenId> ids) const override { return tok_.decode(ids); }
  std::size_t vocab_size() const override { return tok_.vocab_size(); }
  bool is_plain(TokenId id) const override { return !tok_.is_special(id); }
  std::string describe() const override { return "tern tokenizer from " + path_; }

 private:
  tokenizer::Tokenizer tok_;
  std::string path_;
};

}  // namespace

std::unique_ptr<TokenCodec> make_tokenizer_codec(const std::string& tokenizer_json) {
  return std::make_unique<TernCodec>(tokenizer::Tokenizer::from_file(tokenizer_json), tokenizer_json);
}

}  // namespace tern::bench
