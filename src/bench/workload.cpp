#include "bench/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"

namespace tern::bench {

const char* to_string(RangeSemantics s) {
  switch (s) {
    case RangeSemantics::sglang: return "sglang";
    case RangeSemantics::vllm: return "vllm";
  }
  return "?";
}

const char* to_string(DatasetKind d) {
  switch (d) {
    case DatasetKind::random: return "random";
    case DatasetKind::random_ids: return "random-ids";
    case DatasetKind::sharegpt: return "sharegpt";
    case DatasetKind::prompt_file: return "prompt-file";
  }
  return "?";
}

std::pair<int, int> length_range(int length, double ratio, RangeSemantics semantics) {
  if (semantics == RangeSemantics::sglang) {
    int lo = std::max(static_cast<int>(length * ratio), 1);
    return {std::min(lo, length), length};
  }
  int lo = static_cast<int>(std::floor(length * (1.0 - ratio)));
  int hi = static_cast<int>(std::ceil(length * (1.0 + ratio)));
  return {std::max(lo, 1), std::max(hi, 1)};
}

std::string describe(const WorkloadSpec& s) {
  switch (s.dataset) {
    case DatasetKind::random:
    case DatasetKind::random_ids: {
      auto [ilo, ihi] = length_range(s.input_len, s.range_ratio, s.semantics);
      auto [olo, ohi] = length_range(s.output_len, s.range_ratio, s.semantics);
      return cat(to_string(s.dataset), ", ", to_string(s.semantics), " range semantics (ratio ", s.range_ratio,
                 "): input uniform on [", ilo, ", ", ihi, "], output uniform on [", olo, ", ", ohi, "]");
    }
    case DatasetKind::sharegpt:
      return cat("sharegpt ", s.path, s.sharegpt_output_len > 0 ? cat(", output ", s.sharegpt_output_len)
                                                                 : std::string(", output from 2nd turn"));
    case DatasetKind::prompt_file: return cat("prompt file ", s.path, ", output ", s.output_len);
  }
  return "?";
}

namespace {

using Rng = std::mt19937_64;

int draw(Rng& rng, std::pair<int, int> range) {
  return std::uniform_int_distribution<int>(range.first, range.second)(rng);
}

std::vector<TokenId> random_ids(Rng& rng, const TokenCodec& codec, int n) {
  std::uniform_int_distribution<TokenId> pick(0, static_cast<TokenId>(codec.vocab_size() - 1));
  std::vector<TokenId> ids;
  ids.reserve(static_cast<std::size_t>(n));
  while (static_cast<int>(ids.size()) < n) {
    TokenId id = pick(rng);
    if (codec.is_plain(id)) ids.push_back(id);
  }
  return ids;
}

// Decoding random ids and encoding the text again rarely gives the same count with a real BPE
// vocabulary; like vLLM, adjust the ids a few times until the re-encoded text has `n` tokens.
RequestSpec random_text_prompt(Rng& rng, const TokenCodec& codec, int n) {
  std::vector<TokenId> ids = random_ids(rng, codec, n);
  RequestSpec r;
  for (int attempt = 0; attempt < 8; ++attempt) {
    r.prompt = codec.decode(ids);
    int got = static_cast<int>(codec.encode(r.prompt).size());
    r.input_len = got;
    if (got == n) break;
    if (got > n) ids.resize(ids.size() - std::min(ids.size() - 1, static_cast<std::size_t>(got - n)));
    else for (auto extra : random_ids(rng, codec, n - got)) ids.push_back(extra);
  }
  return r;
}

std::vector<RequestSpec> random_workload(const WorkloadSpec& s, const TokenCodec& codec, bool as_ids) {
  Rng rng(s.seed);
  auto in_range = length_range(s.input_len, s.range_ratio, s.semantics);
  auto out_range = length_range(s.output_len, s.range_ratio, s.semantics);
  std::vector<RequestSpec> out;
  for (int i = 0; i < s.num_prompts; ++i) {
    int in = draw(rng, in_range);
    int gen = draw(rng, out_range);
    RequestSpec r;
    if (as_ids) {
      r.prompt_ids = random_ids(rng, codec, in);
      r.input_len = in;
    } else {
      r = random_text_prompt(rng, codec, in);
    }
    r.output_len = gen;
    out.push_back(std::move(r));
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TERN_CHECK(in, "tern bench: cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ShareGPT format: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}].
std::vector<RequestSpec> sharegpt_workload(const WorkloadSpec& s, const TokenCodec& codec) {
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(read_file(s.path));
  } catch (const nlohmann::json::exception& e) {
    fail("tern bench: ", s.path, " is not valid JSON: ", e.what());
  }
  TERN_CHECK(data.is_array(), "tern bench: ", s.path, ": expected a JSON array of conversations");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& entry : data) {
    const auto* conv = entry.contains("conversations") ? &entry["conversations"] : nullptr;
    if (!conv || !conv->is_array() || conv->size() < 2) continue;
    pairs.emplace_back((*conv)[0].value("value", ""), (*conv)[1].value("value", ""));
  }
  Rng rng(s.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);  // sglang and vLLM shuffle before taking N
  std::vector<RequestSpec> out;
  for (const auto& [prompt, answer] : pairs) {
    if (static_cast<int>(out.size()) >= s.num_prompts) break;
    RequestSpec r{prompt, {}, static_cast<int>(codec.encode(prompt).size()), s.sharegpt_output_len};
    if (r.output_len <= 0) r.output_len = static_cast<int>(codec.encode(answer).size());
    if (r.input_len < 2 || r.output_len < 2) continue;  // the filter both reference tools apply
    out.push_back(std::move(r));
  }
  TERN_CHECK(!out.empty(), "tern bench: ", s.path, " has no usable conversation (two turns, >= 2 tokens)");
  return out;
}

// One prompt per line; a line that is a JSON object uses its "prompt" field. Cycles to fill N.
std::vector<RequestSpec> prompt_file_workload(const WorkloadSpec& s, const TokenCodec& codec) {
  std::istringstream lines(read_file(s.path));
  std::vector<std::string> prompts;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    if (line.front() == '{') line = nlohmann::json::parse(line).value("prompt", "");
    prompts.push_back(line);
  }
  TERN_CHECK(!prompts.empty(), "tern bench: prompt file ", s.path, " is empty");
  std::vector<RequestSpec> out;
  for (int i = 0; i < s.num_prompts; ++i) {
    const std::string& p = prompts[static_cast<std::size_t>(i) % prompts.size()];
    out.push_back({p, {}, static_cast<int>(codec.encode(p).size()), s.output_len});
  }
  return out;
}

}  // namespace

std::vector<RequestSpec> build_workload(const WorkloadSpec& spec, const TokenCodec& codec) {
  TERN_CHECK(spec.num_prompts > 0, "tern bench: --num-prompts must be positive");
  switch (spec.dataset) {
    case DatasetKind::random: return random_workload(spec, codec, false);
    case DatasetKind::random_ids: return random_workload(spec, codec, true);
    case DatasetKind::sharegpt: return sharegpt_workload(spec, codec);
    case DatasetKind::prompt_file: return prompt_file_workload(spec, codec);
  }
  return {};
}

}  // namespace tern::bench
