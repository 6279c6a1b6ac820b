// CudaBackend's private state, shared by its .cpp files (host compiler; includes the runtime API).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/indexer.cuh"
#include "backends/cuda/kernels/kv_row.cuh"
#include "backends/cuda/kernels/linear.cuh"
#include "backends/cuda/kernels/mhc.cuh"
#include "backends/cuda/kernels/moe.cuh"
#include "backends/cuda/library_gemm.h"

namespace tern::cuda {

// From how many tokens the dense products that are not exact run on the library (FP8 on cuBLASLt, bf16 on cuBLAS).
// Session 22 (H100, bench-step --ab): 65, where 512 kept 65-511 on linear_x8's 64-token tiles (each weight read once a
// tile); decode batch 128 86.2 against 92.0 ms (-6.3%), 256 112.3 against 118.9 (-5.6%). Not batch invariant from 65
// (as the grouped MoE already was).
inline constexpr int64_t kDenseLibraryMinTokensDefault = 65;
// The grouped MoE kernels from 129 tokens. Session 19 (H100, tern_gpu_bench --only moe, mxfp4, whole op): the bulk
// ring streams 88-91% of copy at 16-64 tokens and beats the grouped kernels there (1 007 against 1 382 us at 64);
// above 64 only the register kernel was left then (21-25% of copy), so the grouped kernels took 65+. Session 21 ran
// the bulk ring up to 256 tokens; session 22 (bench-step --ab): with the bulk ring at 65-128, decode batch 128 87.0
// against 92.0 ms (-5.4%), batch 256 unchanged (the op: 1 480 against 1 655 us at 128, 1 784 against 1 783 at 256).
inline constexpr int64_t kMoeGroupedMinTokensDefault = 129;

struct CudaBackend::Impl {
  cudaStream_t stream = nullptr;
  int num_sms = 132;
  DeviceBuffer workspace;
  DeviceBuffer counters;  // split-K arrival counters, kept at zero by the kernels
  int64_t num_counters = 0;
  DeviceBuffer error_word;
  DeviceBuffer sample_buffer;  // sample_rows: packed requests, results, weights (grown as needed)
  // Device tables of expert pointers, keyed by the host span they were built from and checked against the
  // whole host copy at every use: a new model may reuse the span's host address and some device addresses
  // (checking only the first and last weight let a stale table point into freed weights: NaN router scores
  // in the graph tests of sessions 6 and 7, about 1 run in 25).
  struct ExpertTable {
    DeviceBuffer table;
    std::vector<ExpertDesc> host;  // what `table` holds
    bool aligned = false;  // every matrix and scale pointer 16-byte aligned (the bulk copies need it)
    // MXFP4 scales that fold into e4m3 codes (moe_e4m3_fold_ok), checked once when the table is built. Like the
    // pointers, it assumes the experts' bytes do not change under a live table: weights are uploaded once and never
    // rewritten.
    bool e4m3_fold_ok = false;
  };
  std::map<std::pair<const void*, size_t>, ExpertTable> expert_tables;
  // The streaming linear's K groups per weight (by its device address), from tune_linears.
  std::unordered_map<const void*, int> linear_groups;
  std::unordered_set<const void*> linear_ran;  // weights linear() ran: retuning them would change results
  int moe_variant = 0;  // set_moe_variant (benchmarks and tests)
  int64_t moe_e4m3_calls = 0;  // moe_experts calls on the e4m3 grouped kernels (CudaBackend::moe_e4m3_calls)
  // Calls that took the in-kernel quantisations (CudaBackend::fused_quant_calls): linear_x8 quantising x, the bulk
  // MoE kernels quantising x and h as they stage them.
  int64_t x8_quantising_calls = 0, moe_stage_quant_calls = 0;
  // The side branch of a step (ops/branch.h): its own stream, workspace, split-K counters and library GEMMs (their
  // cuBLAS / cuBLASLt workspace), swapped in for the main branch's while a side branch is open, so that the two
  // branches' kernels never share scratch, counters or a library workspace (in a captured step the branches run at
  // once); the events fork the side stream from the main one and join it back.
  struct Lane {
    cudaStream_t stream = nullptr;
    DeviceBuffer workspace, counters;
    std::unique_ptr<LibraryGemm> library;
  };
  Lane side;
  cudaEvent_t fork_event = nullptr, join_event = nullptr;
  bool in_side = false;         // between side_begin and side_end
  bool side_concurrent = false;  // the open branch runs on the side stream (graph capture)
  bool side_pending = false;     // side work recorded on join_event and not yet joined
  // TERN_BRANCH_PRIORITY (CudaBackend::branch_priority): the side branches the model marks longer run on side_high
  // (the greatest stream priority), the others on side_low (the least, as the capture stream and every stream before);
  // side_begin picks. The graphs are instantiated with their nodes' priorities (captured from the streams) only while
  // this is on. On since session 30 (H200, three rounds: -0.31% / -0.65% / 0.00% a step at batch 1 / 16 / 64).
  bool branch_priority = true;
  cudaStream_t side_low = nullptr, side_high = nullptr;

  // Library GEMMs for many tokens (library_gemm.h), made at first use (the side lane's with no side streams of its
  // own: made by the eager runs that size the lanes before any capture); off in batch-invariant mode.
  std::unique_ptr<LibraryGemm> library;
  bool batch_invariant = false;
  bool moe_prefill_library = false;  // set_moe_prefill_library: the expanded-bf16 library MoE over the grouped one
  // From how many tokens the routed FP4 experts take the grouped tensor-core kernels (moe_grouped.cuh) instead of
  // the decode kernels; TERN_MOE_GROUPED_MIN_TOKENS (1 .. kLibraryMinTokens; default kMoeGroupedMinTokensDefault).
  // Chosen by the call's token count, a graph's padded slots included: near the threshold a replay and an eager step
  // of the same batch may take different paths (not batch invariant, as every choice by token count).
  int64_t moe_grouped_min_tokens = kMoeGroupedMinTokensDefault;
  bool x8_quantises_x = true;  // set_x8_quantises_x: linear_x8 quantises x itself where it can (linear_x8.cuh)
  // set_moe_stage_quant: the bulk MoE kernels quantise x and h as they stage them. Off by default since session 22:
  // 0.7% slower at batch 16 / 64 than the separate act_fake_quant launches (H100, bench-step --ab).
  bool moe_stage_quant = false;
  // MoeParams::stage_quant_h where the plan kernel quantises x (TERN_MOE_STAGE_QUANT_H=1, A/B): h alone quantised in the
  // bulk down kernel's staging, the act_fake_quant launch between up and down gone. Off until measured.
  bool moe_stage_quant_h = false;
  // MoeParams::early_down (TERN_MOE_EARLY_DOWN=0 for A/B), which acts where the down kernel is resident (one token).
  // On since session 29: batch 1 -0.96% (H100, in-process A/B, three rounds; session 28: -0.38%). With job windows (16
  // tokens and more) it was measured at nothing or worse (session 22: the MoE op at 16 tokens 389.7 against 383.1 us;
  // sessions 27 and 29 within noise), so the kernel ignores it there.
  bool moe_early_down = true;
  // MoeParams::resident and claims (TERN_MOE_RESIDENT, TERN_MOE_CLAIMS; =0 for A/B): the bulk kernels' resident
  // windows up to kMoeResidentMaxTokens tokens, and with them items claimed past a static share. The same bits.
  bool moe_resident = true;
  bool moe_claims = true;
  // The library path's hc_post writes the mix's squares column (TERN_HC_POST_SQUARES=0: A/B).
  bool hc_post_squares = true;
  // route_scored_regs_kernel where it takes the shape (route_in_registers); TERN_ROUTE_REGS=0: route_scored_kernel.
  bool route_regs = true;
  // Where launch_moe runs (decode), its plan kernel also routes and quantises x (MoeParams::route, x_from): one
  // launch on the step's path where there were three; TERN_MOE_FUSED_PLAN=0: route_scored / act_quant launches of
  // their own (A/B; the same bits).
  bool moe_fused_plan = true;
  // hc_mix_kernel stages its fn columns before its PDL wait (HcParams::early_fn; TERN_HC_EARLY_FN=0: after).
  bool hc_early_fn = true;
  // indexer_topk_kernel's short ways (IndexerParams::fast_topk; TERN_TOPK_FAST=0: off).
  bool topk_fast = true;
  // linear_x8's splits of 2-8 blocks whose grid is one block an SM add their sums as one thread-block cluster
  // (LinearParams::cluster_split; TERN_X8_CLUSTER=0: through the workspace, fences and arrival counters). The same
  // bits either way.
  bool x8_cluster = true;
  int64_t dense_library_min_tokens = kDenseLibraryMinTokensDefault;  // dense_library_for
  // The tensor-core decode attention's keys a split (AttentionParams::split_keys; TERN_ATTENTION_SPLIT_KEYS, 16 ..
  // 1024): fewer keys a split, more blocks a query (at batch 1 an SWA query of 128 keys is one split of two tiles in
  // 4 blocks), at most 8 splits a query.
  int64_t attention_split_keys = kAttentionSplitKeysDefault;
  DeviceBuffer library_workspace;  // the library MoE's per-chunk buffers and the indexer's keys and products
  void* pinned = nullptr;          // host staging of the library paths (the MoE's plan, the indexer's positions)
  size_t pinned_bytes = 0;
  // The recorded steps and the device memories (CudaBackend::step_graphs / memory / step_memory), made by the
  // backend's constructor.
  std::unique_ptr<CudaStepGraphs> graphs;
  std::unique_ptr<DeviceMemory> pool, step_memory;
  ~Impl();

  // A transient device tensor of an op (what outlives a kernel beside the workspace: a quantised x, a padded
  // output), from step_memory: inside a recorded step an arena block, at the same address every replay. Never
  // core's Tensor(dtype, shape, Device::cuda), whose memory refuses to allocate while a step is recorded.
  Tensor tensor(DType dtype, Shape shape, TensorInit init = TensorInit::uninitialized);

  // At least `bytes` of scratch, valid until the next call (ordered on the stream, so reuse is safe).
  void* scratch(size_t bytes);
  // The same for the library paths' second workspace (for what they need beside a result already in the
  // op workspace), and for pinned host memory (grown after a synchronisation: the caller has waited for
  // every earlier use).
  void* library_scratch(size_t bytes);
  void* pinned_scratch(size_t bytes);
  LibraryGemm& lib();
  // Whether a product of T tokens takes the library path (T large, not batch invariant).
  bool library_for(int64_t T) const { return !batch_invariant && T >= kLibraryMinTokens; }
  // Dense products that are not exact (FP8 block-scaled with --activations fp8 on cuBLASLt, bf16 weights on cuBLAS)
  // from dense_library_min_tokens (default kLibraryMinTokens; TERN_DENSE_LIBRARY_MIN_TOKENS lowers it for the A/B of
  // decode batches of 65-511 tokens, where linear_x8's 64-token tiles read the weights once per tile: session 21
  // measured 6 FP8 products a layer at ~317 us for ~132 MB at 128 tokens, and the 1 GB head is read twice).
  bool dense_library_for(int64_t T) const { return !batch_invariant && T >= dense_library_min_tokens; }
  // TERN_MOE_PREFILL=library moves prefill chunks (library-sized calls) to the library MoE; below that size the
  // grouped kernels stay (the library MoE does not take them: they would fall to the register kernel).
  bool moe_library_forced(int64_t T) const { return moe_prefill_library && library_for(T); }
  // Whether a moe_experts call of T tokens takes the grouped FP4 kernels (not batch invariant either).
  bool moe_grouped_for(int64_t T) const { return !batch_invariant && T >= moe_grouped_min_tokens; }
  int* err() const { return static_cast<int*>(error_word.data()); }
};

// Host-side helpers of the op implementations.
void require_cuda_f32(std::string_view op, std::initializer_list<const TensorView*> views);
// The same for views read as rows (TensorView::row_stride): each row contiguous, evenly spaced.
void require_cuda_f32_rows(std::string_view op, std::initializer_list<const TensorView*> views);
DeviceMat device_mat(const ops::Weight& w);
// One linear or grouped linear (groups > 1) on the backend's stream, with the tuned K groups of the weight.
void run_linear(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups, const TensorView& y);
// The library paths (backend_library.cpp): false when the call is not theirs (few tokens, batch-invariant
// mode, a shape the expanders do not take), and the caller runs its own kernels.
bool run_library_linear(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                        const TensorView& y);
// --activations fp8 on a prefill chunk: x quantised 1x128 and cuBLASLt's block-scaled FP8 product on the FP8
// weight as it is; false when the card, the library or the shape cannot (the caller takes another path).
bool run_library_linear_fp8(CudaBackend::Impl& impl, const TensorView& x, const ops::Weight& w, int64_t groups,
                            const TensorView& y);
// The same product of rows already quantised (ops::Fp8Rows, padded to the library's token multiple: values and
// scales hold at least that many rows, the scales' rows exactly that far apart); false as above, or when x's
// layout is not that.
bool run_library_linear_fp8_rows(CudaBackend::Impl& impl, const ops::Fp8Rows& x, const ops::Weight& w, int64_t groups,
                                 const TensorView& y);
bool run_library_moe(CudaBackend::Impl& impl, const MoeParams& p, std::span<const ops::Expert> experts);
// Whether run_library_moe / run_grouped_moe take these params (what they test first; moe_experts asks before it
// decides where the routing and x's quantisation run).
bool library_moe_takes(const CudaBackend::Impl& impl, const MoeParams& p);
bool grouped_moe_takes(const CudaBackend::Impl& impl, const MoeParams& p);
// The routed experts of a prefill chunk on the grouped FP4 kernels (moe_grouped.cuh): for the token counts the
// library takes, FP4 experts, unless moe_prefill_library; no host readback.
bool run_grouped_moe(CudaBackend::Impl& impl, const MoeParams& p);
// squares_done: the squares column is there already (launch_hc_post_squares wrote it into
// library_hc_partial).
bool run_library_hc(CudaBackend::Impl& impl, HcParams& p, bool head, bool squares_done = false);
// The scratch run_library_hc takes its partials [T][mix + 1] from (the same bytes for the same params).
float* library_hc_partial(CudaBackend::Impl& impl, const HcParams& p, bool head);
// Whether run_library_hc takes these params (many tokens, aligned streams).
bool library_hc_for(const CudaBackend::Impl& impl, const HcParams& p);
// Writes the scores [n, num_keys] (in `scores`, which must not be the op workspace) when it takes the call.
bool run_library_indexer(CudaBackend::Impl& impl, const IndexerParams& p, float* scores);
inline KvRowDesc kv_desc(const ops::KvRowFormat& f) {
  return KvRowDesc{f.format == ops::KvFormat::fp8_ds ? 1 : 0, f.head_dim, f.rope_dim, f.row_bytes()};
}
inline int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
// Sparse attention (eager and decode mode): the parameters both share, after checking that a kernel exists
// for the row format; then the launch with its split workspace.
AttentionParams attention_params(const char* op, const TensorView& q, const ops::KvRowFormat& format,
                                 const TensorView& selected, const TensorView& sinks, float scale,
                                 const TensorView& out, const CudaBackend::Impl& impl);
void launch_attention(const char* op, AttentionParams& p, CudaBackend::Impl& impl);
// The indexer kernels' limits: at most kMaxIndexerHeads heads, dim a multiple of 4, key rows 16-byte aligned.
void check_indexer_shape(const char* op, const IndexerParams& p);

}  // namespace tern::cuda
