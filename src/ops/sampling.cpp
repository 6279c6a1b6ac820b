#include "ops/sampling.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/context.h"

namespace tern::ops {

void pack_sample_rows(std::span<const SampleRowSpec> specs, int64_t vocab, std::vector<uint8_t>& out) {
  TERN_CHECK(vocab > 0 && vocab < (int64_t{1} << 31), "sample_rows: vocab ", vocab, " out of range");
  std::vector<SampleRowDesc> descs(specs.size());
  std::vector<int32_t> ids;
  std::vector<int32_t> seen;
  std::vector<std::pair<int32_t, int32_t>> counts;
  for (size_t r = 0; r < specs.size(); ++r) {
    SampleRowDesc d = specs[r].params;
    TERN_CHECK(d.top_logprobs >= -1 && d.top_logprobs <= sampling::kMaxTopLogprobs, "sample_rows: row ", r,
               " asks for ", d.top_logprobs, " top logprobs (at most ", sampling::kMaxTopLogprobs, ")");
    TERN_CHECK(d.temperature == d.temperature && d.top_p == d.top_p && d.min_p == d.min_p, "sample_rows: row ", r,
               " has a NaN parameter");
    TERN_CHECK(sampling::row_greedy(d) || (d.uniform >= 0.0 && d.uniform < 1.0), "sample_rows: row ", r,
               " has the uniform ", d.uniform, " outside [0, 1)");
    d.seen_offset = static_cast<int32_t>(ids.size());
    d.seen_count = 0;
    if (d.repetition != 1.0f) {
      seen.clear();
      for (int32_t t : specs[r].seen)
        if (t >= 0 && t < vocab) seen.push_back(t);
      std::sort(seen.begin(), seen.end());
      TERN_CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end(), "sample_rows: row ", r,
                 " repeats a seen id");
      ids.insert(ids.end(), seen.begin(), seen.end());
      d.seen_count = static_cast<int32_t>(seen.size());
    }
    d.counts_offset = static_cast<int32_t>(ids.size());
    d.counts_count = 0;
    if (d.presence != 0.0f || d.frequency != 0.0f) {
      counts.clear();
      for (const auto& c : specs[r].output_counts)
        if (c.first >= 0 && c.first < vocab) counts.push_back(c);
      std::sort(counts.begin(), counts.end());
      TERN_CHECK(std::adjacent_find(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
                   return a.first == b.first;
                 }) == counts.end(),
                 "sample_rows: row ", r, " repeats an output token");
      for (const auto& [t, n] : counts) {
        ids.push_back(t);
        ids.push_back(n);
      }
      d.counts_count = static_cast<int32_t>(counts.size());
    }
    TERN_CHECK(ids.size() < (size_t{1} << 31), "sample_rows: the histories are too large");
    descs[r] = d;
  }
  const size_t head = descs.size() * sizeof(SampleRowDesc);
  out.resize(head + ids.size() * sizeof(int32_t));
  if (!descs.empty()) std::memcpy(out.data(), descs.data(), head);
  if (!ids.empty()) std::memcpy(out.data() + head, ids.data(), ids.size() * sizeof(int32_t));
}

void sample_rows(const Context& ctx, const TensorView& logits, std::span<const SampleRowSpec> specs,
                 std::span<SampledRow> out) {
  TERN_CHECK(logits.dtype() == DType::f32 && logits.rank() == 2, "sample_rows: logits must be f32 [rows, vocab]");
  TERN_CHECK(static_cast<size_t>(logits.dim(0)) == specs.size() && specs.size() == out.size(), "sample_rows: ",
             logits.dim(0), " rows of logits, ", specs.size(), " requests, ", out.size(), " results");
  TERN_CHECK(logits.dim(1) > 0, "sample_rows: empty rows");
  if (specs.empty()) return;
  ctx.backend_for(logits.device()).sample_rows(logits, specs, out);
}

}  // namespace tern::ops
