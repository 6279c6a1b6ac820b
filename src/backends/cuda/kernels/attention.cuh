// Sparse attention of one sequence's chunk (host interface; semantics in ops/attention.h): all heads of
// a query share each decoded K=V row. Four paths (attention_path):
//   bf16 tensor cores, prefill (attention_prefill.cu): FP8 rows, up to 64 heads, head_dim 128 / 256 / 512,
//     eager mode, only where the caller says the chunk takes the library GEMMs (AttentionParams::prefill) and
//     TERN_ATTENTION_PREFILL is not 0. One block per query walks all its keys (no split, no merge).
//   bf16 tensor cores (attention_mma.cu): the same rows and shapes otherwise (decode steps, small chunks,
//     --batch-invariant). Keys are split across blocks (flash-decoding): one block per (query, split) covers
//     all heads; a query's splits form one thread-block cluster and merge the partials (max, sum, weighted
//     rows) with the sink through distributed shared memory. Both tensor-core paths round q and the softmax
//     weights to bf16 (the rows are exact in bf16).
//   bf16 tensor cores, heads split (attention_heads.cu): instead of the previous one when TERN_ATTENTION_DECODE
//     selects it and the rows are FP8 with 64 rope dims: the same arithmetic head for head (the same bits), in
//     blocks of 16 or 32 heads per (query, split), two blocks an SM.
//   f32 CUDA cores (attention.cu): f32 rows (the exact KV mode) and any other shape; exact f32 arithmetic,
//     partials through a workspace and attention_combine_kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels/kv_row.cuh"
#include "backends/cuda/kernels/paged_rows.cuh"

namespace tern::cuda {

// Keys a split of the tensor-core decode kernels (attention_split.cuh) by default: runs of ~128 keys (two tiles of 64).
inline constexpr int64_t kAttentionSplitKeysDefault = 128;

struct AttentionParams {
  const float* q = nullptr;  // [n, heads, head_dim]
  int64_t n = 0, heads = 0, start = 0;
  KvRowDesc fmt;
  const uint8_t* chunk_rows = nullptr;  // [n, row_bytes]
  const uint8_t* ring = nullptr;        // [window, row_bytes]
  int64_t window = 0;
  PagedRowsDesc compressed;             // >= num_compressed rows of row_bytes, in pages
  int64_t num_compressed = 0;
  int ratio = 0;
  const int32_t* selected = nullptr;    // [n, k_sel] or null
  int64_t k_sel = 0;
  const float* sinks = nullptr;         // [heads]
  float scale = 1.0f;
  float* out = nullptr;                 // [n, heads, head_dim]
  float* partial = nullptr;             // workspace: attention_partial_floats()
  int* err = nullptr;
  int num_sms = 132;
  // Decode mode (positions != null): n slots of one query each. Slot i's query is at positions[i] (-1: an
  // inert padding slot, which writes zeros and reads nothing), its own row is chunk_rows row i, its ring
  // starts at the address rings[i], its compressed rows are in the pages of the pool at pools[i] through the
  // block table at comp_tables[i] (compressed gives only the page geometry), and it sees (positions[i] + 1) /
  // ratio compressed rows; num_compressed is then only the bound that sizes the launch.
  // With firsts (a sequence of several queries in consecutive slots): slot i's window positions from its
  // sequence's first position positions[firsts[i]] on are the step's rows chunk_rows[firsts[i] + position - first
  // position], the older ones in its ring.
  const int64_t* positions = nullptr;
  const int64_t* firsts = nullptr;
  const uint64_t* rings = nullptr;
  const uint64_t* pools = nullptr;
  const uint64_t* comp_tables = nullptr;
  // Eager mode: the caller's chunk takes the library GEMMs (CudaBackend::Impl::library_for: many tokens, not
  // --batch-invariant), so it may run on the prefill kernel, whose bits differ from the decode kernel's.
  bool prefill = false;
  // step_attention with ops::StepAttentionArgs::inv_freq (decode mode): out's last 2 * rope_half dims of each
  // head rotated back at positions[i], as rope_kernel would after the op. The heads kernel does it in its merge
  // (rope_pair, the same bits); the other kernels are followed by rope_kernel (launch_sparse_attention).
  const float* rope_inv_freq = nullptr;
  int64_t rope_half = 0;
  // sparse_attention in eager mode on the prefill wgmma kernels (attention_out_in_kernel): the epilogue rotates each
  // head's last 2 * out_rope_half dims back at out_positions[i] (rope_pair, inverse: rope_kernel's bits), and with
  // out_q set writes the output quantised 1x128 as act_quant_kernel would (its bytes, out_q [n, heads * head_dim];
  // its scales token-major, out_scales[b * out_scale_ld + i]) in place of out.
  const int64_t* out_positions = nullptr;
  const float* out_inv_freq = nullptr;
  int64_t out_rope_half = 0;
  uint8_t* out_q = nullptr;
  float* out_scales = nullptr;
  int64_t out_scale_ld = 0;
  // sparse_attention with ops::AttentionArgs::q_inv_freq, where the prefill kernels run (attention_q_norm_in_kernel):
  // q as wq_b wrote it; their q load norms each head (RMS over head_dim, no weight, q_norm_eps) and rotates its last
  // 2 * q_rope_half dims at q_positions[i], norm_rope_kernel's arithmetic (rms_norm_lanes, rope_pair), before the
  // bf16 rounding: the same bits as norm_rope then the kernel, without q's f32 pass (2 GiB a layer at 8K tokens).
  const int64_t* q_positions = nullptr;
  const float* q_inv_freq = nullptr;
  int64_t q_rope_half = 0;
  float q_norm_eps = 0.0f;
  // The tensor-core decode kernels' keys a split (mma_split_plan; TERN_ATTENTION_SPLIT_KEYS): a query's splits, and
  // with them its tiles and merge order, from its key count and this alone (batch invariant for a fixed value).
  int64_t split_keys = kAttentionSplitKeysDefault;
};

// f32_cuda_cores_any_width: f32 rows of a head_dim the other kernels are not built for (attention_any.cu).
enum class AttentionPath {
  f32_cuda_cores,
  bf16_tensor_cores,
  bf16_tensor_cores_prefill,
  bf16_tensor_cores_heads,
  f32_cuda_cores_any_width
};
AttentionPath attention_path(const AttentionParams& p);
const char* attention_path_name(AttentionPath path);
// Whether the path p takes rotates and quantises its output in its epilogue (AttentionParams::out_q, out_inv_freq):
// the prefill wgmma kernels (versions 2, 3) where a 128-column block of a head lies in one warpgroup's half and the
// rope dims are within the head's last 64 (warpgroup 1's last chunk); elsewhere the caller runs rope and act_quant
// after the op.
bool attention_out_in_kernel(const AttentionParams& p, int64_t rope_half);
// TERN_Q_NORM_FOLD (a switch, on; read once): whether sparse_attention hands q's RMS norm and RoPE to the prefill
// kernels' q load where attention_q_norm_in_kernel allows (off: norm_rope first; the same bits either way).
bool q_norm_fold_enabled();
// Whether the path p norms and rotates q in its q load (AttentionParams::q_inv_freq): the prefill kernels, at a
// head_dim of 128-512 (whole warps' columns) with the rope pairs at even dims in the last 128; elsewhere the caller
// runs norm_rope first.
bool attention_q_norm_in_kernel(const AttentionParams& p, int64_t rope_half);

// Splits of the f32 path (the tensor-core path needs no workspace: attention_partial_floats is then 0).
int attention_splits(const AttentionParams& p);
int64_t attention_partial_floats(const AttentionParams& p);
// Launches the path attention_path(p) names; returns the launch's error (the cluster launch reports it
// here, not only through cudaGetLastError).
cudaError_t launch_sparse_attention(const AttentionParams& p, cudaStream_t stream);

// Whether the built kernels take head_dim hd (128, 256, 512); f32 rows of any other head_dim up to
// kAttentionAnyMaxHeadDim take attention_any_kernel (launch_attention_any: f32 CUDA cores, one warp a head).
inline bool attention_built_for(int64_t hd) { return hd == 128 || hd == 256 || hd == 512; }
constexpr int64_t kAttentionAnyMaxHeadDim = 512;
cudaError_t launch_attention_any(const AttentionParams& p, cudaStream_t stream);

// The tensor-core path alone (attention_mma.cu); the caller has checked attention_path(p).
constexpr int kAttentionMmaMaxHeads = 64;
constexpr size_t kAttentionMmaMaxSmem = 227 * 1024;  // sm_90's shared memory per block (opt-in)
// Shared memory of the tensor-core kernel for rows of format f (0: no kernel for its head_dim).
size_t attention_mma_smem_bytes(const KvRowDesc& f);
cudaError_t launch_attention_mma(const AttentionParams& p, cudaStream_t stream);

// The kernel of the decode tensor-core path (TERN_ATTENTION_DECODE, read once; a value other than these throws
// tern::Error):
//   cluster (the default): attention_mma_kernel, one block of all heads per (query, split);
//   heads: attention_heads_kernel, 16 heads a block while the launch fits the GPU in one round of two blocks an
//     SM, else 32 (attention_heads_per_block); heads16 / heads32: always 16 / 32 (A/B).
// Every choice gives the same bits. set_attention_decode is for tests and benchmarks.
enum class AttentionDecode { cluster, heads, heads16, heads32 };
AttentionDecode attention_decode();
void set_attention_decode(AttentionDecode d);
const char* attention_decode_name(AttentionDecode d);  // the TERN_ATTENTION_DECODE value

// The heads-split kernel alone (attention_heads.cu): whether it takes rows of format f with `heads` heads (FP8,
// head_dim 128 / 256 / 512, 64 rope dims, <= 64 heads), its shared memory at 16 or 32 heads a block, the heads a
// block attention_heads_per_block(p) picks for a launch under the current selection, and the launch (0: that
// pick; 16 / 32: forced). The caller has checked attention_heads_supported.
bool attention_heads_supported(const KvRowDesc& f, int64_t heads);
size_t attention_heads_smem_bytes(const KvRowDesc& f, int heads_per_block);
int attention_heads_per_block(const AttentionParams& p);
cudaError_t launch_attention_heads(const AttentionParams& p, cudaStream_t stream, int heads_per_block = 0);

// The prefill path alone (eager mode only): one block per query, all its keys, in one of four versions:
//   1: attention_prefill_kernel (attention_prefill.cu, mma.sync);
//   2: attention_prefill_wgmma_kernel (attention_prefill_wgmma.cu, Hopper wgmma), the same numerics;
//   3: the same kernel with the decode of a tile overlapping its S MMAs (version 2's bits), the default until
//      session 34;
//   4: attention_prefill_ws_kernel (attention_prefill_ws.cu, session 32): a producer warpgroup decodes 32-key tiles
//      into a ring while two consumer warpgroups each take one tile of a pair (S once, not twice); its own bits;
//   5: the same kernel on the launch's key rows decoded once to bf16 (attention_kv_bf16_kernel, session 34) into
//      AttentionParams::partial (attention_prefill_kv_bytes: attention_partial_floats asks for it), its producer
//      only copying; version 4's bits; the default since session 34.
// attention_prefill_smem_bytes / launch_attention_prefill follow the selected version (1 when off); the
// _v1 / _wgmma entry points run one version whatever is selected (tests).
size_t attention_prefill_smem_bytes(const KvRowDesc& f);
cudaError_t launch_attention_prefill(const AttentionParams& p, cudaStream_t stream);
size_t attention_prefill_v1_smem_bytes(const KvRowDesc& f);
cudaError_t launch_attention_prefill_v1(const AttentionParams& p, cudaStream_t stream);
size_t attention_prefill_wgmma_smem_bytes(const KvRowDesc& f);
cudaError_t launch_attention_prefill_wgmma(const AttentionParams& p, cudaStream_t stream,
                                           bool overlap_decode = false);
size_t attention_prefill_ws_smem_bytes(const KvRowDesc& f);
cudaError_t launch_attention_prefill_ws(const AttentionParams& p, cudaStream_t stream);
int64_t attention_prefill_kv_bytes(const AttentionParams& p);
cudaError_t launch_attention_prefill_pre(const AttentionParams& p, cudaStream_t stream);  // p.partial: kv_bytes
// TERN_ATTENTION_PREFILL: 0 keeps prefill chunks on attention_mma_kernel (A/B), 1 version 1 (mma.sync), 2 / 3
// version 2 / 3 (wgmma; 3 overlaps the FP8 decode with the MMAs), 4 the warp-specialised kernel (slower than 3,
// session 33), 5 (the default) it on keys decoded once a launch; set_attention_prefill(on)
// selects the default or 0 and set_attention_prefill_version any (benchmarks and tests).
bool attention_prefill_enabled();
int attention_prefill_version();
void set_attention_prefill(bool on);
void set_attention_prefill_version(int version);

}  // namespace tern::cuda
