// Workloads: the list of requests a benchmark sends (prompt and lengths), built deterministically
// from a seed. Lengths are measured with the run's TokenCodec.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/codec.h"

namespace tern::bench {

struct RequestSpec {
  std::string prompt;              // text sent as the user message or completion prompt
  std::vector<TokenId> prompt_ids; // set for the random-ids dataset: sent as ids (completions API)
  int input_len = 0;               // prompt tokens by the codec (the server's usage overrides it)
  int output_len = 0;              // max_tokens asked for
};

// The two random-length conventions (serving.md): sglang draws uniformly from [max(L*r, 1), L],
// vLLM from [L*(1-r), L*(1+r)].
enum class RangeSemantics { sglang, vllm };

enum class DatasetKind { random, random_ids, sharegpt, prompt_file };

struct WorkloadSpec {
  DatasetKind dataset = DatasetKind::random;
  RangeSemantics semantics = RangeSemantics::sglang;
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 1024;
  double range_ratio = 0.0;        // sglang and vLLM both default to 0 (meaning differs: see above)
  std::string path;                // ShareGPT JSON or prompt file
  int sharegpt_output_len = 0;     // > 0 overrides the second turn's length
  std::uint64_t seed = 1;
};

const char* to_string(RangeSemantics s);
const char* to_string(DatasetKind d);
// Human-readable description of how lengths are drawn, printed in every report.
std::string describe(const WorkloadSpec& spec);

// The [lo, hi] range a length L is drawn from under the given semantics.
std::pair<int, int> length_range(int length, double ratio, RangeSemantics semantics);

std::vector<RequestSpec> build_workload(const WorkloadSpec& spec, const TokenCodec& codec);

}  // namespace tern::bench
