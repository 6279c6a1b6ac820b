// Routing and the routed experts (host interface).
// moe: a plan kernel groups the (token, pick) pairs by expert (stable, deterministic) and lists the jobs
// (expert, up to 8*NT of its pairs); the up kernel runs w1 and w3 of each job's expert on tensor cores
// with SwiGLU fused, the down kernel w2, and a combine kernel adds each token's weighted pairs in pick
// order. Weights stay in their checkpoint format. Two families of up/down kernels: at decode sizes with FP4
// experts the bulk-copy pipeline (moe_bulk_impl.cuh: whole row tiles into shared memory, decoded there),
// otherwise moe_expert_kernel (moe_impl.cuh: FP4/FP8 dequantized in registers). moe_path_name says which.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/linear.cuh"

namespace tern::cuda {

// The scored routing's register kernel takes up to kRouteRegsPerLane experts a lane and 32 picks; `regs` false, or
// larger shapes, route_scored_kernel (the same bits).
constexpr int kRouteRegsPerLane = 8;
inline bool route_in_registers(int64_t E, int k) { return E <= 32 * kRouteRegsPerLane && k <= 32; }
void launch_route_scored(const float* logits, const float* bias, int64_t T, int64_t E, int k, float routed_scale,
                         int32_t* indices, float* weights, int* err, bool regs, cudaStream_t stream);
void launch_route_hash(const float* logits, const void* tid2eid, bool tid2eid_i64, int64_t vocab,
                       const int64_t* token_ids, int64_t T, int64_t E, int k, float routed_scale, int32_t* indices,
                       float* weights, int* err, cudaStream_t stream);

// One expert's three matrices (w1 gate [inter, D], w2 down [D, inter], w3 up [inter, D]).
struct ExpertDesc {
  const void* w[3] = {nullptr, nullptr, nullptr};
  const void* s[3] = {nullptr, nullptr, nullptr};
  float global_scale[3] = {1.0f, 1.0f, 1.0f};
};

// The routing launch_moe's plan kernel runs first (MoeParams::route): the bits of launch_route_scored (bias set; the
// register kernel's shape only, route_in_registers) or launch_route_hash (tid2eid set), written to indices and
// weights, which MoeParams::indices and weights then name.
struct MoeRoute {
  const float* logits = nullptr;  // [T, E]; nullptr: no routing here
  const float* bias = nullptr;    // scored: [E]
  const void* tid2eid = nullptr;  // hash: [vocab, k], i64 or i32
  bool tid2eid_i64 = false;
  int64_t vocab = 0;
  const int64_t* token_ids = nullptr;  // hash: [T]
  float scale = 1.0f;
  int32_t* indices = nullptr;  // [T, k]
  float* weights = nullptr;    // [T, k]
};

struct MoeParams {
  const float* x = nullptr;  // [T, D]
  int64_t T = 0, D = 0, inter = 0;
  const int32_t* indices = nullptr;  // [T, k]
  const float* weights = nullptr;    // [T, k]
  int k = 0;
  int64_t E = 0;
  const ExpertDesc* experts = nullptr;  // device array [E]
  WeightFormat kind = WeightFormat::mxfp4;
  bool scale_f32 = false;
  float limit = 10.0f;
  float* out = nullptr;  // [T, D]
  // Added to out by the combine (ops::MoeExpertsArgs::shared; nullptr: none), after the event combine_waits (the
  // side branch that writes it: its join, moved from before the routed products to the combine) when set.
  const float* residual = nullptr;
  cudaEvent_t combine_waits = nullptr;
  int* err = nullptr;
  // Every expert matrix and scale pointer 16-byte aligned (the bulk copies need it; checked on the host
  // when the expert table is built).
  bool experts_aligned = false;
  int variant = 0;  // index into the moe_variant_* list (0: the default; others for benchmarks and tests)
  // --activations fp8: x arrives quantised (the caller's act_fake_quant) and every path quantises h, the SwiGLU
  // output, between its up and down products (1x128 e4m3, power-of-two scales: the official reference's FP4 x
  // FP8 experts, with the dequantised values exact in bf16 and f32).
  bool act_fp8 = false;
  // MXFP4 experts whose four scales of every 128-column group lie within 2^8 of their largest (moe_e4m3_fold_ok,
  // computed once per expert table): the e4m3 grouped kernels (moe_grouped_e4m3.cuh) can take them.
  bool e4m3_fold_ok = false;
  // With act_fp8, on the bulk kernels only: x arrives as it is and the kernels quantise x (up) and h (down) as they
  // stage them (stage_x<F, true>): the bits of quantising first, two launches less a call (session 21).
  bool stage_quant = false;
  // The same for h alone (x quantised before, by the plan kernel: x_from): the down kernel quantises h as it stages
  // it, one launch less a call (TERN_MOE_STAGE_QUANT_H, A/B).
  bool stage_quant_h = false;
  // The resident bulk down kernel's producer (MoeBulkPlan::resident) claims and copies w2's rows into its ring before
  // its PDL wait (moe_bulk_kernel says why that is safe), overlapping the up kernel's tail; false: after it. Same bits.
  // Only where the down kernel is resident: with job windows (16 tokens and more) the early copies were measured at
  // nothing or worse (sessions 22, 27, 29: they take DRAM from the up kernel's last blocks).
  bool early_down = false;
  // Work launch_moe's plan kernel takes over from launches of its own, so that a decode step's path holds one kernel
  // where it held three (CudaBackend::moe_experts sets them where launch_moe runs at up to moe_prep_max_tokens() tokens;
  // TERN_MOE_FUSED_PLAN=0: apart):
  // the routing (route.logits set), and with x_from set x's 1x128 FP8 fake quantisation, read from x_from and
  // written to x (act_fake_quant's bits) by blocks beside the one that routes and plans.
  MoeRoute route;
  const float* x_from = nullptr;
  // The plan alone (no route, no x_from) in a block of 256 threads where the experts allow (moe_plan_kernel_small;
  // TERN_MOE_FUSED_PLAN), not 1024 (the same plan).
  bool small_plan = false;
  // The bulk kernels' resident windows up to kMoeResidentMaxTokens tokens (MoeBulkPlan::resident; TERN_MOE_RESIDENT),
  // and with them items claimed from a device counter past a static share (TERN_MOE_CLAIMS; off: fixed ranges). The
  // resident down kernel quantises h as it stages it (act_fp8): the act_fake_quant launch between up and down goes.
  bool resident = false;
  bool claims = false;
};

// Up to this many tokens the bulk kernels may hold every row they read in their window (MoeParams::resident), and
// past a static share of kMoeClaimSharePct percent of the items a block claims the rest one at a time. One token:
// measured on the H100 (session 28, in-process A/B, three rounds) -0.65% at batch 1 against fixed ranges, but +1.1%
// at batch 4 (up resident, down not: 4 x 6 pair rows do not fit beside the down kernel's 5 stages).
inline constexpr int64_t kMoeResidentMaxTokens = 1;
inline constexpr int kMoeClaimSharePct = 50;

// Up to this many tokens (and 256 experts) the plan kernel takes the routing and x's quantisation (moe_prep_kernel, a
// warp a token's routing in one block of 256 threads); more tokens route in a kernel of their own (a block a 4 tokens).
// The default; TERN_MOE_PREP_MAX_TOKENS (1 .. kMoeSmallPlanMaxTokens, process-wide, for A/B) moves it.
inline constexpr int64_t kMoePrepMaxTokens = 8;
// Up to this many tokens (decode steps on the bulk kernels) TERN_MOE_FUSED_PLAN plans in 256 threads (small_plan);
// larger calls (prefill chunks on the register kernel) keep the 1024-thread plan, 4x fewer rounds over their picks.
inline constexpr int64_t kMoeSmallPlanMaxTokens = 64;
// The bound in force (kMoePrepMaxTokens unless TERN_MOE_PREP_MAX_TOKENS or set_moe_prep_max_tokens moved it).
int64_t moe_prep_max_tokens();
void set_moe_prep_max_tokens(int64_t tokens);
bool moe_prep_supported(int64_t T, int64_t E);

// The routing alone (launch_route_scored / launch_route_hash), for the paths that do not run launch_moe's plan.
void launch_moe_route(const MoeParams& p, bool regs, cudaStream_t stream);

// h [rows, inter] f32 row-major quantised in place when p.act_fp8 (the f32 paths: bulk and register kernels).
void quantize_moe_h(const MoeParams& p, float* h, int64_t rows, cudaStream_t stream);

// Variants of the expert kernels (ring depth, consumer warps, stage layout, bookkeeping, or the register
// kernel forced): index 0 is what runs by default; the benchmark and the GPU test sweep all of them. Every
// variant takes the K split from the shape alone (moe_k_slices), so all give the same bits
// (GpuV4.MoeVariantsBitIdentical); one that changed the summation order would have to say so here.
int moe_variant_count();
const char* moe_variant_name(int variant);

// The bulk kernels' timeline instrument (tern_gpu_bench --only moe_timeline): while set, each launch of the up
// (down) kernel writes kMoeBulkStampWords words a block to `up` (`down`), device memory of grid x that many words;
// MoeBulkStamp names them. Cycle counts are the block's SM clock64; *_ns the global timer. Never set in serving.
inline constexpr int kMoeBulkStampWords = 16;
struct MoeBulkStamp {
  enum : int {
    entry_ns,     // global timer at the block's entry (before its PDL wait)
    entry,        // clock64 at entry
    ready,        // clock64 after the barriers' set-up (the block's __syncthreads)
    first_issue,  // the producer's first item's copies issued
    last_issue,   // the producer's last copies issued
    first_full,   // the first item's bytes landed (group 0's first wait returned)
    exit0,        // groups 0..kExitGroups-1 leave their item loops (exit0 + g)
    exit_ns = exit0 + 4,  // global timer as group 0 leaves
    items,        // the block's items
    jobs,         // the jobs its items span
    staged,       // clock64 as the consumers have staged their first job's x (UP) or h (DOWN) window
  };
  static constexpr int kExitGroups = 4;
};
struct MoeBulkStamps {
  unsigned long long* up = nullptr;
  unsigned long long* down = nullptr;
};
void set_moe_bulk_stamps(const MoeBulkStamps& s);
MoeBulkStamps moe_bulk_stamps();

bool moe_kind_supported(WeightFormat kind, int64_t D, int64_t inter);
int64_t moe_workspace_bytes(const MoeParams& p);
// Whether launch_moe takes the bulk-copy kernels for these params (the backend asks it before it quantises x).
bool moe_bulk_taken(const MoeParams& p);
// Name of the expert kernels launch_moe takes for these params (startup report, benchmarks, tests).
const char* moe_path_name(const MoeParams& p);
// Up to this many tokens FP4 experts go to the bulk-copy kernels (larger batches: moe_expert_kernel). The
// backend sends calls from kMoeGroupedMinTokensDefault (65) tokens to the grouped kernels first; 65-256 reach the
// bulk kernels only with TERN_MOE_GROUPED_MIN_TOKENS above them (session 21: the bulk ring past 64 tokens, where
// it was never measured, against the grouped kernels' 65% of copy at batch 128).
inline constexpr int64_t kMoeBulkMaxTokens = 256;
// num_sms: the device's multiprocessor count (the bulk kernels run one persistent block on each).
void launch_moe(const MoeParams& p, void* workspace, int num_sms, cudaStream_t stream);

// The exact experts (moe_exact.cu; --activations f32, every expert weight `exact`): f32 CUDA-core products, one
// block per (token, pick), then launch_moe_combine. The workspace holds y [T * k, D] and pos [T * k]; the block's
// shared memory (D + inter) floats, at most kMoeExactMaxSmem.
inline constexpr size_t kMoeExactMaxSmem = 227 * 1024;
int64_t moe_exact_workspace_bytes(const MoeParams& p);
size_t moe_exact_smem_bytes(const MoeParams& p);
void launch_moe_exact(const MoeParams& p, void* workspace, cudaStream_t stream);

// For the library path (backend_library.cpp), the combine launch_moe ends with: out[t] = sum over the picks
// j of weights[t, j] * y[pos[t, j]], in pick order, + residual[t] when p.residual (after p.combine_waits).
void launch_moe_combine(const MoeParams& p, const float* y, const int* pos, cudaStream_t stream);
// The plan for many pairs (moe_sort.cu): the T*k pairs grouped by expert in pick order (the stable order of
// launch_moe's one-block plan), over many blocks: sorted[] (pair ids), pos[] (each pair's sorted slot), and
// one job {expert, first slot, count} per expert that has pairs, in expert order, *num_jobs of them. `counts` holds moe_sort_count_ints(P, E) ints of scratch.
int64_t moe_sort_count_ints(int64_t P, int64_t E);
void launch_moe_sort(const MoeParams& p, int* counts, int* sorted, int* pos, int* jobs, int* num_jobs,
                     cudaStream_t stream);

}  // namespace tern::cuda
