// Speculative decoding's verdict (issue #18, docs/mtp.md): which of the k tokens a draft model proposed the target
// keeps, and the target's token after them, such that the emitted tokens follow the target's distribution exactly
// (speculative sampling: Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative
// Decoding", 2023; Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling", 2023; vLLM's
// rejection sampler does the same). A verify step gives the target's distributions at the k + 1 positions the
// drafts open; these functions decide, the engine rolls back what was not kept.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace tern::engine {

struct SpecVerdict {
  int accepted = 0;  // drafts kept, 0 .. k
  int32_t next = 0;  // the target's token after them: the correction at the first rejection, or the bonus token
};

// Sampled decoding. p: the target's probabilities at the k + 1 positions, [k + 1][vocab] row-major, each row the
// distribution the request's sampling draws from (penalties, temperature, top-k / top-p / min-p applied; it sums
// to 1). q: the draft's at the first k positions, [k][vocab], the distribution each draft was drawn from (a one-hot
// row for a greedy draft). drafts[j] < vocab. Draft j is kept with probability min(1, p_j(d) / q_j(d)); at the
// first rejection the next token comes from max(0, p_j - q_j) renormalised (p_j where that is all zero), and after
// k kept drafts from p_k. Uniforms come from `rng` in order: one per examined draft, then one for `next` (as
// std::uniform_real_distribution<double>(0, 1)), so a seeded request gives the same tokens every run. Throws on
// mismatched sizes or a draft out of range.
SpecVerdict accept_sampled(std::span<const float> p, std::span<const float> q, int64_t vocab,
                           std::span<const int32_t> drafts, std::mt19937_64& rng);

// Greedy decoding: drafts are kept while each equals the target's choice at its position (target_argmax[j], the
// k + 1 tokens greedy decoding picks from the verify step's rows); `next` is the target's choice after them. The
// emitted tokens are those greedy decoding gives without drafts.
// A token drawn from `dist` (non-negative weights, summing to about 1) with the uniform u in [0, 1): the first index
// whose cumulative weight exceeds u times the sum. How a sampled draft is drawn from its q.
int32_t draw_from(std::span<const float> dist, double u);

SpecVerdict accept_greedy(std::span<const int32_t> target_argmax, std::span<const int32_t> drafts);

}  // namespace tern::engine
