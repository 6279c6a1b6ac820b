#include "tokenizer/normalizer.h"

#include "tokenizer/json_fields.h"

namespace tern::tokenizer {

using namespace json_fields;

Normalizer::Normalizer(const json& spec, const std::string& path) {
  if (!spec.is_null()) add(spec, path);
}

void Normalizer::add(const json& spec, const std::string& path) {
  const std::string type = type_of(spec, path);
  if (type == "Sequence") {
    const json& list = require(spec, "normalizers", path);
    if (!list.is_array()) bad(child(path, "normalizers"), "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i) add(list[i], child(child(path, "normalizers"), i));
  } else if (type == "NFC") {
    forms_.push_back(unicode::Form::nfc);
  } else if (type == "NFD") {
    forms_.push_back(unicode::Form::nfd);
  } else if (type == "NFKC") {
    forms_.push_back(unicode::Form::nfkc);
  } else if (type == "NFKD") {
    forms_.push_back(unicode::Form::nfkd);
  } else {
    bad(child(path, "type"), "normalizer \"" + type + "\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD)");
  }
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (const unicode::Form form : forms_) out = unicode::normalize(out, form);
  return out;
}

}  // namespace tern::tokenizer
