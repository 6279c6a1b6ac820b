#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <queue>

#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"

namespace tern::tokenizer {
namespace {

using namespace json_fields;

constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
constexpr std::size_t kLargeWord = 48;        // above this many symbols, merge with a heap
constexpr std::size_t kMaxCachedBytes = 256;  // longer pieces are not cached
constexpr std::size_t kCacheEntries = 1 << 16;

std::uint64_t pair_key(TokenId a, TokenId b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

std::uint64_t mix(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

std::atomic<std::uint64_t> next_owner{1};

struct WordCache {
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>, Hash, std::equal_to<>> words;
};

WordCache& thread_cache(std::uint64_t owner) {
  thread_local WordCache cache;
  if (cache.owner != owner || cache.words.size() >= kCacheEntries) {
    cache.words.clear();
    cache.owner = owner;
  }
  return cache;
}

}  // namespace

BpeModel::BpeModel(const json& model, const std::string& path) {
  cache_owner_ = next_owner.fetch_add(1);
  const std::string type = type_of(model, path);
  if (type != "BPE") bad(child(path, "type"), "only BPE models are supported, found \"" + type + "\"");
  if (optional(model, "continuing_subword_prefix") || optional(model, "end_of_word_suffix")) {
    bad(path, "continuing_subword_prefix / end_of_word_suffix are not supported (byte-level BPE only)");
  }
  if (const json* d = optional(model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0)) {
    bad(child(path, "dropout"), "BPE dropout is not supported for inference");
  }
  if (get_bool(model, "byte_fallback", path, false)) bad(child(path, "byte_fallback"), "not supported");
  ignore_merges_ = get_bool(model, "ignore_merges", path, false);
  load_vocab(require(model, "vocab", path), child(path, "vocab"));
  if (const json* unk = optional(model, "unk_token")) {
    const std::string name = get_string(*unk, child(path, "unk_token"));
    const auto it = vocab_.find(name);
    if (it == vocab_.end()) bad(child(path, "unk_token"), "\"" + name + "\" is not in model.vocab");
    unk_ = it->second;
  }
  load_merges(require(model, "merges", path), child(path, "merges"));
}

void BpeModel::load_vocab(const json& vocab, const std::string& path) {
  if (!vocab.is_object()) bad(path, "expected an object of token -> id, found " + type_name(vocab));
  vocab_.reserve(vocab.size());
  byte_ids_.fill(-1);
  for (const auto& [token, id_json] : vocab.items()) {
    const std::string id_path = child(path, token);
    const std::int64_t id = get_int(id_json, id_path);
    if (id < 0 || id >= (1 << 30)) bad(id_path, "id out of range");
    vocab_.emplace(token, static_cast<TokenId>(id));
    if (static_cast<std::size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = token;
    if (auto bytes = byte_level::to_bytes(token)) {
      if (bytes->size() == 1) byte_ids_[static_cast<unsigned char>((*bytes)[0])] = static_cast<TokenId>(id);
      byte_vocab_.emplace(std::move(*bytes), static_cast<TokenId>(id));
    }
  }
}

void BpeModel::load_merges(const json& merges, const std::string& path) {
  if (!merges.is_array()) bad(path, "expected an array, found " + type_name(merges));
  std::size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity <<= 1;
  merge_keys_.assign(capacity, kEmpty);
  merge_values_.resize(capacity);
  merge_mask_ = capacity - 1;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    const std::string m_path = child(path, rank);
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const std::size_t space = s.find(' ');
      if (space == std::string::npos) bad(m_path, "expected \"left right\", found \"" + s + "\"");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2) {
      left = get_string(m[0], child(m_path, 0));
      right = get_string(m[1], child(m_path, 1));
    } else {
      bad(m_path, "expected \"left right\" or [left, right], found " + m.dump());
    }
    const auto find = [&](const std::string& token) {
      const auto it = vocab_.find(token);
      if (it == vocab_.end()) bad(m_path, "token \"" + token + "\" is not in model.vocab");
      return it->second;
    };
    add_merge(find(left), find(right), find(left + right), static_cast<std::uint32_t>(rank));
  }
}

void BpeModel::add_merge(TokenId a, TokenId b, TokenId merged, std::uint32_t rank) {
  const std::uint64_t key = pair_key(a, b);
  for (std::uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == kEmpty || merge_keys_[slot] == key) {
      merge_keys_[slot] = key;  // a repeated merge keeps the later rank, as Hugging Face does
      merge_values_[slot] = {rank, merged};
      return;
    }
  }
}

const BpeModel::MergeHit* BpeModel::find_merge(TokenId a, TokenId b) const {
  const std::uint64_t key = pair_key(a, b);
  for (std::uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const std::uint64_t k = merge_keys_[slot];
    if (k == key) return &merge_values_[slot];
    if (k == kEmpty) return nullptr;
  }
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties).
void BpeModel::merge_small(std::vector<TokenId>& syms) const {
  while (syms.size() > 1) {
    std::uint32_t best_rank = UINT32_MAX;
    std::size_t best = 0;
    TokenId merged = 0;
    for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
      const MergeHit* hit = find_merge(syms[i], syms[i + 1]);
      if (hit != nullptr && hit->rank < best_rank) {
        best_rank = hit->rank;
        best = i;
        merged = hit->merged;
      }
    }
    if (best_rank == UINT32_MAX) return;
    syms[best] = merged;
    syms.erase(syms.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

// The same merges in O(n log n) for long words: a heap of candidate pairs over a linked list.
void BpeModel::merge_large(std::vector<TokenId>& syms) const {
  const std::size_t n = syms.size();
  std::vector<std::int64_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<std::int64_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<std::int64_t>(i + 1) : -1;
  }
  using Candidate = std::pair<std::uint32_t, std::size_t>;  // (rank, position)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto push = [&](std::size_t pos) {
    if (next[pos] < 0) return;
    if (const MergeHit* hit = find_merge(syms[pos], syms[next[pos]])) heap.emplace(hit->rank, pos);
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, pos] = heap.top();
    heap.pop();
    if (!alive[pos] || next[pos] < 0) continue;
    const MergeHit* hit = find_merge(syms[pos], syms[next[pos]]);
    if (hit == nullptr || hit->rank != rank) continue;  // stale: a neighbour changed
    const auto right = static_cast<std::size_t>(next[pos]);
    syms[pos] = hit->merged;
    alive[right] = false;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = static_cast<std::int64_t>(pos);
    if (prev[pos] >= 0) push(static_cast<std::size_t>(prev[pos]));
    push(pos);
  }
  std::size_t w = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (alive[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_uncached(std::string_view bytes, std::vector<TokenId>& out) const {
  if (ignore_merges_) {
    if (const auto it = byte_vocab_.find(bytes); it != byte_vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<TokenId> syms;
  syms.reserve(bytes.size());
  for (const char c : bytes) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
    if (id >= 0) {
      syms.push_back(id);
    } else if (unk_) {
      syms.push_back(*unk_);  // a byte without a token: unk when defined, else dropped (as HF does)
    }
  }
  if (syms.size() > kLargeWord) {
    merge_large(syms);
  } else {
    merge_small(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<TokenId>& out) const {
  if (bytes.size() == 1) {
    const TokenId id = byte_ids_[static_cast<unsigned char>(bytes[0])];
    if (id >= 0) out.push_back(id); else if (unk_) out.push_back(*unk_);
    return;
  }
  if (bytes.size() > kMaxCachedBytes) {
    encode_uncached(bytes, out);
    return;
  }
  WordCache& cache = thread_cache(cache_owner_);
  if (const auto it = cache.words.find(bytes); it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const std::size_t first = out.size();
  encode_uncached(bytes, out);
  cache.words.emplace(std::string(bytes), std::vector<TokenId>(out.begin() + first, out.end()));
}

std::optional<TokenId> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size()) return nullptr;
  return &id_to_token_[id];
}

}  // namespace tern::tokenizer
