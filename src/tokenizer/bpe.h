// The BPE model of a byte-level tokenizer.json, working on raw bytes: the vocabulary's byte-level
// strings are turned back into bytes at load, merges become a hash table from a pair of ids to
// (rank, merged id), and encoded words are cached per thread.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tern::tokenizer {

using TokenId = std::int32_t;

class BpeModel {
 public:
  // `model` is the "model" object of tokenizer.json; `path` its JSON path for errors.
  BpeModel(const nlohmann::json& model, const std::string& path);

  // Appends the ids of one pre-tokenized piece (raw bytes) to `out`.
  void encode_piece(std::string_view bytes, std::vector<TokenId>& out) const;

  // Vocabulary in tokenizer.json's spelling (byte-level characters).
  std::optional<TokenId> token_to_id(std::string_view token) const;
  const std::string* id_to_token(TokenId id) const;
  TokenId max_id() const { return static_cast<TokenId>(id_to_token_.size()) - 1; }

 private:
  struct MergeHit {
    std::uint32_t rank;
    TokenId merged;
  };
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>>;

  void load_vocab(const nlohmann::json& vocab, const std::string& path);
  void load_merges(const nlohmann::json& merges, const std::string& path);
  void add_merge(TokenId a, TokenId b, TokenId merged, std::uint32_t rank);
  const MergeHit* find_merge(TokenId a, TokenId b) const;
  void merge_small(std::vector<TokenId>& syms) const;
  void merge_large(std::vector<TokenId>& syms) const;
  void encode_uncached(std::string_view bytes, std::vector<TokenId>& out) const;

  StringMap vocab_;        // tokenizer.json spelling -> id
  StringMap byte_vocab_;   // raw bytes -> id (byte-level tokens only)
  std::vector<std::string> id_to_token_;
  std::array<TokenId, 256> byte_ids_{};  // -1 when the byte has no token
  std::optional<TokenId> unk_;
  bool ignore_merges_ = false;
  // Open-addressing table keyed by (a << 32 | b); empty slots have key ~0.
  std::vector<std::uint64_t> merge_keys_;
  std::vector<MergeHit> merge_values_;
  std::uint64_t merge_mask_ = 0;
  std::uint64_t cache_owner_ = 0;  // identifies this model in the per-thread word caches
};

}  // namespace tern::tokenizer
