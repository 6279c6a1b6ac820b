// mHC (host interface). hc_pre = two kernels: the mixing logits split over the flattened streams (each
// block reads its slice of fn once for up to 8 tokens and writes partial dot products and sums of squares),
// then one block per token that adds the partials in a fixed order and, at the same time, runs Sinkhorn in
// one warp and the collapse (optionally with the RMSNorm that follows it) in the others. hc_head likewise
// with its own fn; hc_post is one elementwise kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/norm.cuh"

namespace tern::cuda {

struct HcParams {
  const float* streams = nullptr;  // [T, hc, D]
  const float* fn = nullptr;       // [mix, hc*D]
  const float* base = nullptr;     // [mix]
  const float* scale = nullptr;    // [3] (pre) or [1] (head)
  int64_t T = 0, hc = 0, D = 0;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f, norm_eps = 1e-6f;
  // hc_pre outputs
  float* post = nullptr;       // [T, hc]
  float* comb = nullptr;       // [T, hc, hc]
  // hc_pre with post and comb apart (ops::HcPreArgs::logits): the finish kernel writes the mixing logits m here in
  // their place, and hc_comb's kernel computes post and comb from them (the same bits).
  float* logits = nullptr;     // [T, mix]
  float* collapsed = nullptr;  // [T, D]
  // hc_pre: collapsed = rms_norm(sum_i pre_i X_i, rms_eps) * norm_weight when `normed`
  bool normed = false;
  const void* norm_weight = nullptr;
  NormWeight norm_kind = NormWeight::none;
  float rms_eps = 1e-6f;
  // hc_pre with the previous sub-layer's hc_post folded in (ops::HcPreArgs::prev_*): the mix kernel computes the
  // streams from these (hc_post_kernel's arithmetic) and writes them to `streams` (then non-const: out_streams).
  const float* prev_streams = nullptr;  // [T, hc, D]
  const float* prev_a = nullptr;        // [T, D]
  const float* prev_post = nullptr;     // [T, hc]
  const float* prev_comb = nullptr;     // [T, hc, hc]
  float* out_streams = nullptr;         // == streams
  // hc_head output
  float* out = nullptr;        // [T, D]
  float* partial = nullptr;    // workspace: hc_partial_floats()
  bool early_fn = true;        // the mix stages fn before its PDL wait (TERN_HC_EARLY_FN=0: after, A/B)
};

// The kernels' limits (the backend checks them): hc == 4, D a multiple of 4 and at most kHcMaxD.
constexpr int64_t kHcMaxD = 8192;

int64_t hc_partial_floats(int64_t T, int64_t hc, int64_t D, bool head);
// The library path of many tokens (backend_v4.cpp): the mixing logits come from a library product written
// as partials of one split, [T][mix + 1] with the sum of squares in column mix (launch_hc_squares), then
// the finish kernel of hc_pre (head false) or hc_head alone.
void launch_hc_squares(const float* streams, int64_t T, int64_t N, int64_t ld, float* out, cudaStream_t stream);
// launch_hc_post into `out`, then launch_hc_squares of `out` into squares[t * ld], in one kernel (the same
// bits; one read of the streams less): the library path's hc_pre with the previous hc_post folded in. For hc
// == 4 and D of 1024, 2048 or 4096 (hc_post_squares_supported).
bool hc_post_squares_supported(int64_t hc, int64_t D);
void launch_hc_post_squares(const float* streams, const float* a, const float* post, const float* comb,
                            int64_t T, int64_t D, float* out, float* squares, int64_t ld,
                            cudaStream_t stream);
void launch_hc_finish(const HcParams& p, bool head, int splits, cudaStream_t stream);
void launch_hc_pre(const HcParams& p, cudaStream_t stream);
void launch_hc_head(const HcParams& p, cudaStream_t stream);
// post and comb from p.logits (p.T tokens): one warp a token.
void launch_hc_comb(const HcParams& p, cudaStream_t stream);
// out[t, k] = post[t, k] * a[t] + sum_j comb[t, j, k] * streams[t, j]   (hc == 4, D % 4 == 0)
void launch_hc_post(const float* streams, const float* a, const float* post, const float* comb, int64_t T,
                    int64_t hc, int64_t D, float* out, cudaStream_t stream);

}  // namespace tern::cuda
