// tokenizer.json "added_tokens": tokens matched in the text before pre-tokenization, as Hugging
// Face's AddedVocabulary does it: tokens with `normalized: false` are found in the raw text, the
// rest in the normalized text; leftmost-longest matching; lstrip / rstrip / single_word honoured.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tern::tokenizer {

using TokenId = std::int32_t;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  AddedVocabulary(const nlohmann::json& list, const std::string& path);

  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Splits `text`: calls on_text(piece) for the text between tokens and on_token(id) for each
  // token, in order. `raw_pass` selects the tokens with normalized == false.
  void split(std::string_view text, bool raw_pass, const std::function<void(std::string_view)>& on_text,
             const std::function<void(TokenId)>& on_token) const;

 private:
  struct Matcher {
    struct Node {
      std::vector<std::pair<unsigned char, std::int32_t>> children;
      std::int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view s, std::int32_t token);
    // Index of the longest token starting at text[pos] and its length, or -1.
    std::int32_t longest_at(std::string_view text, std::size_t pos, std::size_t& length) const;
  };

  std::vector<AddedToken> tokens_;
  Matcher raw_;
  Matcher normalized_;
};

}  // namespace tern::tokenizer
