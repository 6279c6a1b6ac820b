// The CUDA backend for Hopper (sm_90a): every op of ops/backend.h on device tensors (Device::cuda).
//
// Ops are asynchronous on the backend's stream (the legacy default stream unless set_stream is called),
// so consecutive ops and copies are ordered without synchronisation. Each op checks on the host what it
// can (dtypes, shapes, alignment) and launches; what only the data can tell (a token id outside the
// vocabulary, an expert index out of range, a selected entry that is not visible) sets a bit in a device
// error word that check_device_errors() turns into a tern::Error. Scratch memory comes from one
// workspace that grows on demand and never while a graph is being captured (reserve it first).
//
// No CUDA header here: tools and tests include this without the toolkit's headers.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/cuda/tune_table.h"
#include "ops/backend.h"
#include "ops/context.h"

namespace tern::cuda {

class CudaStepGraphs;  // cuda_graph_arena.h

class CudaBackend final : public ops::Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string_view name() const override { return "cuda"; }
  std::vector<std::string> kernel_paths() const override;

  void embedding(const TensorView& table, const TensorView& ids, const TensorView& out) override;
  void add(const TensorView& x, const TensorView& y) override;
  void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) override;
  void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) override;
  void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq, bool inverse) override;
  void norm_rope(const TensorView& x, const TensorView& weight, float eps, const TensorView& positions,
                 const TensorView& inv_freq, const TensorView& out) override;
  void linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override;
  void grouped_linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override;
  void act_quant_rows(const TensorView& x, const ops::Fp8Rows& out) override;
  void grouped_linear_fp8(const ops::Fp8Rows& x, int64_t groups, const ops::Weight& w, const TensorView& y) override;
  void dequantize(const ops::Weight& w, const TensorView& out) override;
  void prefetch(const ops::Weight& w) override;
  void hc_pre(const ops::HcPreArgs& a) override;
  void hc_comb(const ops::HcCombArgs& a) override;
  void hc_post(const TensorView& streams, const TensorView& a, const TensorView& post, const TensorView& comb,
               const TensorView& out) override;
  void hc_head(const ops::HcHeadArgs& a) override;
  void hc_expand(const TensorView& x, const TensorView& streams) override;
  void kv_pack(const TensorView& x, const ops::KvRowFormat& f, const TensorView& rows) override;
  void kv_unpack(const TensorView& rows, const ops::KvRowFormat& f, const TensorView& x) override;
  int64_t compressor_update(const ops::CompressorArgs& a) override;
  void indexer_scores(const ops::IndexerArgs& a, const TensorView& scores) override;
  void indexer_topk(const ops::IndexerArgs& a, int topk, const TensorView& indices) override;
  void sparse_attention(const ops::AttentionArgs& a, const TensorView& out) override;
  void sparse_attention_fp8(const ops::AttentionArgs& a, const ops::Fp8Rows& out) override;
  void route_scored(const TensorView& logits, const TensorView& bias, float routed_scale, const TensorView& indices,
                    const TensorView& weights) override;
  void route_hash(const TensorView& logits, const TensorView& tid2eid, const TensorView& token_ids,
                  float routed_scale, const TensorView& indices, const TensorView& weights) override;
  void moe_experts(const ops::MoeExpertsArgs& a) override;
  bool moe_experts_routes() const override { return true; }
  // Batched steps (backend_step.cpp)
  void step_attention(const ops::StepAttentionArgs& a, const TensorView& out) override;
  void step_compressor(const ops::StepCompressorArgs& a) override;
  void step_compress_emit(const ops::StepCompressEmitArgs& a) override;
  bool step_compress_emit_supported(int64_t width) const override;
  void step_indexer_topk(const ops::StepIndexerArgs& a, int topk, const TensorView& indices) override;
  void store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                       const TensorView& firsts, int64_t window) override;
  void store_paged_rows(const TensorView& rows, const ops::StepPagedRows& dest, const TensorView& positions,
                        int ratio) override;
  void sample_rows(const TensorView& logits, std::span<const ops::SampleRowSpec> specs,
                   std::span<ops::SampledRow> out) override;
  void synth_fill(const ops::SynthFillArgs& a) override;  // backend_synth.cpp
  // ops/branch.h: a side branch on a second stream inside CUDA graph capture (in order otherwise);
  // cuda_backend.cpp. side_streams_enabled(): TERN_SIDE_STREAM=0 keeps captured branches in order too.
  void side_begin(bool critical) override;
  void side_end() override;
  void side_join() override;
  // After a capture whose body threw (CudaStepGraphs::capture): forgets a side branch it left open or unjoined, whose
  // events were recorded in that capture (waiting on them outside it is an error: session 19 saw a failed verify
  // capture turn every later step's join into cudaErrorInvalidValue).
  void abandon_branch();
  static bool side_streams_enabled();
  // TERN_BRANCH_PRIORITY (a switch): in a captured step the side branches the model marks longer (ops::BranchLength:
  // the CSA indexer's) run at a higher stream priority than the rest, kept in the graph's kernel nodes, so the block
  // scheduler starts their blocks first (on by default); off, every node runs at the launch stream's priority. The
  // same kernels and bits either way.
  bool branch_priority() const;

  // Waits for every op issued so far.
  void synchronize();
  // Synchronises, then throws (and clears the word) if a kernel raised a data error since the last call.
  void check_device_errors();
  // cudaStream_t to issue on (nullptr: the legacy default stream).
  void set_stream(void* stream);
  void* stream() const;
  // Grows the scratch workspace of both lanes (the main and the side branch's) now (before a graph capture, say).
  void reserve_workspace(size_t bytes);
  size_t workspace_bytes() const;  // both lanes' together
  int num_sms() const;

  // The backend's device memories and recorded steps, made with it (issue #17 item 5: owned here, reached
  // through the backend and its context, not looked up by device):
  // memory(): the stream-ordered pool (cudaMallocAsync on the backend's stream), for device tensors made without
  //   a context (states, uploads, tests) and copies: register_backend() installs it as Device::cuda's memory
  //   (core/tensor.h). It refuses to allocate while a step is being recorded (step_graphs().capture): such a
  //   tensor would not be an arena block, so the capture fails loudly.
  // step_memory(): a step's tensors: the context's (ops::Context::tensor, the forward's intermediates) and the ops'
  //   own transient tensors (Impl::tensor). Arena blocks while the step graphs have a scope open (what a recorded
  //   step allocates, at the same addresses every replay: cuda_graph_arena.h), else the pool's.
  DeviceMemory& memory();
  DeviceMemory& step_memory();
  CudaStepGraphs& step_graphs();

  // Tuning (backend_tune.cpp, docs/cuda-backend.md "Tuning"): the streaming linear kernel's K groups per
  // weight, measured on this GPU. For each weight the table lacks (when `measure`), every candidate is
  // timed at 1, 16 and 64 tokens inside a CUDA graph, on copies of the weight that do not fit in L2 (as
  // decode reads it), and the fastest goes into the table; then every weight the table knows runs with its
  // entry. Call after the weights are on the device and before they first run (so that no result, graph or
  // eager, depends on when tuning happened): changing a weight that has run throws.
  struct TuneSummary {
    int weights = 0, shapes = 0, measured = 0, from_table = 0, not_streamed = 0;
    double seconds = 0;                // spent measuring
    std::vector<std::string> choices;  // "<key>: 8 groups (41.2 us; the rule's 4: 47.0 us)"
  };
  TuneSummary tune_linears(std::span<const ops::LinearUse> linears, TuneTable& table, bool measure);
  // The streaming linear's K groups for a weight from now on (tests; 0: back to the rule).
  void set_linear_groups(const ops::Weight& w, int groups);
  // "NVIDIA H200|sm_90|132 SMs": what a tuning table is measured on.
  std::string tune_device() const;

  // Products of many tokens (>= kLibraryMinTokens, library_gemm.h: prefill chunks) run on library GEMMs
  // (cuBLAS) unless the backend is batch invariant: then every product runs on tern's own kernels, whose
  // bits for a token do not depend on the other tokens of the step (docs/cuda-backend.md, "Library GEMMs").
  void set_batch_invariant(bool on);
  bool batch_invariant() const;
  // What uninitialised eager device tensors (TensorInit::uninitialized: the model's activations) hold: none
  // (the default, no fill), zero, or poison (0xff bytes, NaN for f32: an op that reads an element nobody wrote
  // shows NaN). TERN_ACTIVATION_FILL=none|zero|poison sets it at start-up; GpuModel_.LongPromptIgnoresActivationFill
  // compares poison with zero.
  enum class ActivationFill { none, zero, poison };
  // "none", "zero" or "poison"; throws naming `where` (the variable or option) for any other value.
  static ActivationFill parse_activation_fill(std::string_view name, std::string_view where);
  static void set_activation_fill(ActivationFill fill);
  static ActivationFill activation_fill();
  static int64_t library_min_tokens();  // kLibraryMinTokens
  // The library's own time for a product of T tokens by a [out, in] weight, bf16 (or f32) operands, on
  // random data: its rate on that shape. And for the MoE's products alone (experts already in bf16, T x k
  // pairs spread evenly over E experts).
  double library_gemm_us(int64_t T, int64_t out, int64_t in, bool f32, int reps);
  double library_moe_us(int64_t T, int64_t E, int64_t k, int64_t D, int64_t inter, int reps);

  // Variants of the routed-expert kernels (ring depth, warps, stage layout, bookkeeping, or the register
  // kernel forced; names in moe_variant_name order): the benchmark and the GPU test sweep them. 0, the
  // default, is what serving runs; set another only in a benchmark or test (all give the same bits: see
  // moe.cuh).
  static int moe_variants();
  static std::string moe_variant_name(int variant);
  void set_moe_variant(int variant);
  // The kernel path moe_experts takes for a call of T tokens with experts of this format and shape, k picks a token
  // (the bulk down kernel's resident window holds T k rows).
  std::string moe_path(const ops::Weight& w1, int64_t T, int64_t k) const;
  // Prefill chunks' routed experts (>= kLibraryMinTokens, not batch invariant): false (the default) runs FP4
  // experts on the grouped kernels (moe_grouped.cuh), true on the older library path (experts expanded to
  // bf16, per-expert cuBLAS products). TERN_MOE_PREFILL=library sets it at start-up; for A/B runs and tests.
  void set_moe_prefill_library(bool on);
  // From how many tokens FP4 experts take the grouped kernels (the decode kernels below); TERN_MOE_GROUPED_MIN_TOKENS
  // sets it at start-up (default library_min_tokens()). For measuring the crossover and for tests.
  void set_moe_grouped_min_tokens(int64_t tokens);
  int64_t moe_grouped_min_tokens() const;
  // moe_experts calls that ran the e4m3 grouped kernels (TERN_MOE_GROUPED=e4m3, moe_grouped_e4m3.cuh) since the
  // backend was made: what tests assert ran, since that mode falls back to the bf16 wgmma kernels where it cannot.
  int64_t moe_e4m3_calls() const;
  // --activations fp8 decode products: true (the default; TERN_X8_QUANT=0 sets false at start-up) lets
  // linear_x8 quantise x itself where it can (up to 8 tokens: one act_quant launch less, the same bits); false
  // always launches act_quant first. For A/B runs and the bit-identity test.
  void set_x8_quantises_x(bool on);
  // --activations fp8 routed experts on the bulk decode kernels: true (the default; TERN_MOE_STAGE_QUANT=0 sets
  // false at start-up) has the kernels quantise x and h as they stage them (two launches less a call, the same
  // bits); false launches act_fake_quant before each. For A/B runs and the bit-identity test.
  void set_moe_stage_quant(bool on);
  // The kernel-path switches the TERN_* variables set at start-up, by the variable's name, for A/B runs in
  // one process (`tern bench-step --ab`): TERN_MOE_STAGE_QUANT, TERN_MOE_EARLY_DOWN, TERN_X8_QUANT (0 / 1),
  // TERN_X8_QUANT_MAX_N (8 / 16), TERN_MOE_GROUPED_MIN_TOKENS and TERN_DENSE_LIBRARY_MIN_TOKENS (1 ..
  // kLibraryMinTokens), TERN_MOE_VARIANT (0 .. moe_variants() - 1), TERN_PDL (0 / 1), TERN_MOE_PREP_MAX_TOKENS (1 ..
  // kMoeSmallPlanMaxTokens), TERN_BRANCH_PRIORITY (0 / 1). knob() reads the value
  // in force; both throw naming the known switches for another name, and set_knob a value out of range. Steps
  // recorded before a change keep the kernels they were recorded with: record them again.
  static std::vector<std::string> knob_names();
  int64_t knob(std::string_view name) const;
  void set_knob(std::string_view name, int64_t value);
  // Calls since the backend was made that took linear_x8's quantising form / the bulk MoE kernels' staged
  // quantisation: what tests assert ran (both fall back to the separate launches where they cannot).
  struct FusedQuantCalls {
    int64_t linear_x8 = 0, moe_staged = 0;
  };
  FusedQuantCalls fused_quant_calls() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The one CudaBackend (made once; later calls return it), its pool installed (again at each call) as the memory
// of Device::cuda (core/tensor.h's set_device_memory: device tensors made without a context). Throws with a
// clear message when there is no CUDA device or it is not a Hopper GPU (sm_90).
CudaBackend& register_backend();
// The context of register_backend()'s instance (ops/context.h), with its step memory and step graphs: what
// tests, tools and app::device_context run device ops in. Throws as register_backend does.
const ops::Context& context();

}  // namespace tern::cuda
