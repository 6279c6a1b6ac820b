// tokenizer.json "normalizer": none, NFC, NFD, NFKC, NFKD, or a Sequence of them (utf8proc).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/unicode.h"

namespace tern::tokenizer {

class Normalizer {
 public:
  Normalizer() = default;
  // `spec` may be null (no normalization).
  Normalizer(const nlohmann::json& spec, const std::string& path);

  bool empty() const { return forms_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  void add(const nlohmann::json& spec, const std::string& path);
  std::vector<unicode::Form> forms_;
};

}  // namespace tern::tokenizer
