#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace tern::tokenizer {

using namespace json_fields;

namespace {

// Ids a post-processor puts around a single sequence.
struct PostProcessor {
  std::vector<TokenId> prefix, suffix;
};

TokenId special_token_id(const json& pair, const std::string& path) {
  if (!pair.is_array() || pair.size() != 2) bad(path, "expected [token, id]");
  return static_cast<TokenId>(get_int(pair[1], child(path, 1)));
}

void add_template(const json& spec, const std::string& path, PostProcessor& post) {
  const std::string single_path = child(path, "single");
  const json& single = require(spec, "single", path);
  if (!single.is_array()) bad(single_path, "expected an array");
  const json& specials = require(spec, "special_tokens", path);
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string p = child(single_path, i);
    if (optional(single[i], "Sequence")) {
      seen_sequence = true;
      continue;
    }
    const json& special = require(single[i], "SpecialToken", p);
    const std::string name = get_string(require(special, "id", child(p, "SpecialToken")), child(child(p, "SpecialToken"), "id"));
    const std::string sp = child(child(path, "special_tokens"), name);
    const json& ids = require(require(specials, name, child(path, "special_tokens")), "ids", sp);
    if (!ids.is_array()) bad(child(sp, "ids"), "expected an array");
    for (std::size_t k = 0; k < ids.size(); ++k)
      (seen_sequence ? post.suffix : post.prefix).push_back(static_cast<TokenId>(get_int(ids[k], child(child(sp, "ids"), k))));
  }
}

void add_post_processor(const json& spec, const std::string& path, PostProcessor& post) {
  if (spec.is_null()) return;
  const std::string type = type_of(spec, path);
  if (type == "ByteLevel") return;  // changes offsets only
  if (type == "Sequence") {
    const json& list = require(spec, "processors", path);
    if (!list.is_array()) bad(child(path, "processors"), "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i) add_post_processor(list[i], child(child(path, "processors"), i), post);
  } else if (type == "TemplateProcessing") {
    add_template(spec, path, post);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    post.prefix.insert(post.prefix.begin(), special_token_id(require(spec, "cls", path), child(path, "cls")));
    post.suffix.push_back(special_token_id(require(spec, "sep", path), child(path, "sep")));
  } else {
    bad(child(path, "type"), "post-processor \"" + type + "\" is not supported");
  }
}

void check_decoder(const json& spec, const std::string& path) {
  if (spec.is_null()) bad(path, "missing: tern needs the ByteLevel decoder of a byte-level BPE");
  const std::string type = type_of(spec, path);
  if (type == "Sequence") {
    const json& list = require(spec, "decoders", path);
    if (!list.is_array() || list.empty()) bad(child(path, "decoders"), "expected a non-empty array");
    for (std::size_t i = 0; i < list.size(); ++i) check_decoder(list[i], child(child(path, "decoders"), i));
  } else if (type != "ByteLevel") {
    bad(child(path, "type"), "decoder \"" + type + "\" is not supported (byte-level BPE needs ByteLevel)");
  }
}

}  // namespace

struct Tokenizer::Impl {
  AddedVocabulary added;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  PostProcessor post;
  std::vector<std::string> bytes_of;  // id -> the bytes it decodes to
  std::vector<std::uint8_t> special;  // id -> 1 for special added tokens
  std::vector<const AddedToken*> added_of;
  std::unordered_map<std::string, TokenId> added_ids;
  SpecialIds special_ids;

  explicit Impl(const json& root) {
    if (!root.is_object()) bad("$", "expected a JSON object");
    model = std::make_unique<BpeModel>(require(root, "model", ""), "model");
    added = AddedVocabulary(root.value("added_tokens", json()), "added_tokens");
    normalizer = Normalizer(root.value("normalizer", json()), "normalizer");
    pre_tokenizer = PreTokenizer(root.value("pre_tokenizer", json()), "pre_tokenizer");
    if (!pre_tokenizer.has_byte_level()) bad("pre_tokenizer", "no ByteLevel step: tern supports byte-level BPE only");
    add_post_processor(root.value("post_processor", json()), "post_processor", post);
    check_decoder(root.value("decoder", json()), "decoder");
    build_id_tables();
    for (const TokenId id : post.prefix) check_id(id, "post_processor");
    for (const TokenId id : post.suffix) check_id(id, "post_processor");
  }

  void check_id(TokenId id, const std::string& path) const {
    if (id < 0 || static_cast<std::size_t>(id) >= bytes_of.size()) bad(path, "refers to id " + std::to_string(id) + ", not in the vocabulary");
  }

  // A token's decoded bytes, by the ByteLevel decoder's rule: byte-level characters map back to
  // bytes; a token with any other character stands for its own UTF-8 text.
  static std::string decoded_bytes(const std::string& token) {
    auto bytes = byte_level::to_bytes(token);
    return bytes ? std::move(*bytes) : token;
  }

  void build_id_tables() {
    std::size_t size = static_cast<std::size_t>(model->max_id()) + 1;
    for (const AddedToken& t : added.tokens()) size = std::max(size, static_cast<std::size_t>(t.id) + 1);
    bytes_of.resize(size);
    special.assign(size, 0);
    added_of.assign(size, nullptr);
    for (TokenId id = 0; id <= model->max_id(); ++id) bytes_of[id] = decoded_bytes(*model->id_to_token(id));
    for (const AddedToken& t : added.tokens()) {
      bytes_of[t.id] = decoded_bytes(t.content);
      special[t.id] = t.special ? 1 : 0;
      added_of[t.id] = &t;
      added_ids[t.content] = t.id;
    }
    const auto find = [&](std::string_view name) -> std::optional<TokenId> {
      if (const auto it = added_ids.find(std::string(name)); it != added_ids.end()) return it->second;
      return model->token_to_id(name);
    };
    special_ids = {find("<｜begin▁of▁sentence｜>"), find("<｜end▁of▁sentence｜>"), find("<｜User｜>"),
                   find("<｜Assistant｜>"), find("<think>"), find("</think>")};
  }

  void encode_segment(std::string_view segment, std::vector<TokenId>& ids) const {
    std::string prefixed;
    if (pre_tokenizer.adds_prefix_space() && !segment.empty() && segment[0] != ' ') {
      prefixed = " " + std::string(segment);
      segment = prefixed;
    }
    thread_local std::vector<Span> pieces;
    pre_tokenizer.split(segment, pieces);
    for (const Span& s : pieces) model->encode_piece(segment.substr(s.begin, s.end - s.begin), ids);
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special) const {
    if (const std::size_t bad_at = unicode::find_invalid_utf8(text); bad_at != std::string_view::npos) {
      fail("cannot encode: the text is not valid UTF-8 (first bad byte at offset ", bad_at,
           "); decode it with replacement characters first");
    }
    std::vector<TokenId> ids;
    ids.reserve(text.size() / 3 + 8);
    if (add_special) ids.insert(ids.end(), post.prefix.begin(), post.prefix.end());
    const auto push_id = [&ids](TokenId id) { ids.push_back(id); };
    const auto plain = [&](std::string_view segment) { encode_segment(segment, ids); };
    const auto raw_text = [&](std::string_view segment) {
      if (normalizer.empty()) {
        added.split(segment, false, plain, push_id);
      } else {
        const std::string normalized = normalizer.apply(segment);
        added.split(normalized, false, plain, push_id);
      }
    };
    added.split(text, true, raw_text, push_id);
    if (add_special) ids.insert(ids.end(), post.suffix.begin(), post.suffix.end());
    return ids;
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    fail(source, ": not valid JSON: ", e.what());
  }
  try {
    return Tokenizer(std::make_unique<Impl>(root));
  } catch (const Error& e) {
    fail(source, ": ", e.what());
  }
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in.good(), "cannot open tokenizer file ", path, ": check the path (a tokenizer.json is expected)");
  std::ostringstream text;
  text << in.rdbuf();
  return from_json(text.str(), path);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (const TokenId id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return unicode::lossy(bytes);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_ids.find(std::string(token)); it != impl_->added_ids.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= impl_->bytes_of.size()) return std::nullopt;
  if (const AddedToken* t = impl_->added_of[id]) return t->content;
  if (const std::string* s = impl_->model->id_to_token(id); s && !s->empty()) return *s;
  return std::nullopt;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  TERN_CHECK(id >= 0 && static_cast<std::size_t>(id) < impl_->bytes_of.size(), "token id ", id,
             " is outside the vocabulary (size ", impl_->bytes_of.size(), ")");
  return impl_->bytes_of[id];
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() && impl_->special[id] != 0;
}

std::size_t Tokenizer::vocab_size() const { return impl_->bytes_of.size(); }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added.tokens(); }
const Tokenizer::SpecialIds& Tokenizer::special_ids() const { return impl_->special_ids; }

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(TokenId id) {
  std::string out;
  if (skip_special_ && tokenizer_->is_special(id)) return out;
  pending_ += tokenizer_->token_bytes(id);
  const std::size_t used = unicode::append_lossy(out, pending_, /*final_chunk=*/false);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out = unicode::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tern::tokenizer
