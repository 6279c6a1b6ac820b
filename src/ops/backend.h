// The one interface every backend implements.
//
// Each op in ops/<family>.h is a free function that checks shapes and calls the matching method here on
// the backend of its context (ops/context.h). A backend overrides the methods it has kernels for; the
// defaults throw "no <device> kernel for op <name> (<dtype>)" so a missing kernel is loud, never a silent
// fallback to another device.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/step.h"
#include "ops/elementwise.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/sampling.h"
#include "ops/synth.h"

namespace tern::ops {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // "op: kernel (units, precision)" for each op this backend runs, for the startup log.
  virtual std::vector<std::string> kernel_paths() const;

  // elementwise.h
  virtual void embedding(const TensorView& table, const TensorView& ids, const TensorView& out);
  virtual void add(const TensorView& x, const TensorView& y);
  virtual void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& out);
  virtual void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out);
  // norm.h
  virtual void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out);
  // rope.h
  virtual void rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
                    bool inverse);
  // The two in turn unless the backend fuses them (the same bits either way).
  virtual void norm_rope(const TensorView& x, const TensorView& weight, float eps, const TensorView& positions,
                         const TensorView& inv_freq, const TensorView& out);
  // linear.h
  virtual void linear(const TensorView& x, const Weight& w, const TensorView& y);
  virtual void grouped_linear(const TensorView& x, const Weight& w, const TensorView& y);
  virtual void act_quant_rows(const TensorView& x, const Fp8Rows& out);
  virtual void grouped_linear_fp8(const Fp8Rows& x, int64_t groups, const Weight& w, const TensorView& y);
  virtual void dequantize(const Weight& w, const TensorView& out);
  virtual void prefetch(const Weight& w);  // a hint (linear.h): by default nothing to do
  // mhc.h
  virtual void hc_pre(const HcPreArgs& a);
  virtual void hc_comb(const HcCombArgs& a);
  virtual void hc_post(const TensorView& streams, const TensorView& a, const TensorView& post,
                       const TensorView& comb, const TensorView& out);
  virtual void hc_head(const HcHeadArgs& a);
  virtual void hc_expand(const TensorView& x, const TensorView& streams);
  // kv_row.h
  virtual void kv_pack(const TensorView& x, const KvRowFormat& f, const TensorView& rows);
  virtual void kv_unpack(const TensorView& rows, const KvRowFormat& f, const TensorView& x);
  // compressor.h
  virtual int64_t compressor_update(const CompressorArgs& a);
  // indexer.h
  virtual void indexer_scores(const IndexerArgs& a, const TensorView& scores);
  virtual void indexer_topk(const IndexerArgs& a, int topk, const TensorView& indices);
  // attention.h
  virtual void sparse_attention(const AttentionArgs& a, const TensorView& out);
  virtual void sparse_attention_fp8(const AttentionArgs& a, const Fp8Rows& out);
  // moe.h
  virtual void route_scored(const TensorView& logits, const TensorView& bias, float routed_scale,
                            const TensorView& indices, const TensorView& weights);
  virtual void route_hash(const TensorView& logits, const TensorView& tid2eid, const TensorView& token_ids,
                          float routed_scale, const TensorView& indices, const TensorView& weights);
  virtual void moe_experts(const MoeExpertsArgs& a);
  // Whether moe_experts runs MoeExpertsArgs::route itself (the CUDA backend: in the launch that plans the experts);
  // otherwise ops::moe_experts runs route_scored / route_hash first and passes moe_experts the picks.
  virtual bool moe_experts_routes() const { return false; }
  // step.h (batched steps)
  virtual void step_attention(const StepAttentionArgs& a, const TensorView& out);
  virtual void step_compressor(const StepCompressorArgs& a);
  virtual void step_compress_emit(const StepCompressEmitArgs& a);
  virtual bool step_compress_emit_supported(int64_t width) const { return width > 0; }
  virtual void step_indexer_topk(const StepIndexerArgs& a, int topk, const TensorView& indices);
  virtual void store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                               const TensorView& firsts, int64_t window);
  virtual void store_paged_rows(const TensorView& rows, const StepPagedRows& dest, const TensorView& positions,
                                int ratio);
  // sampling.h (specs checked and counted by ops::sample_rows; results on the host on return)
  virtual void sample_rows(const TensorView& logits, std::span<const SampleRowSpec> specs,
                           std::span<SampledRow> out);
  // synth.h (synthetic weights)
  virtual void synth_fill(const SynthFillArgs& a);
  // branch.h (concurrent branches of a step): ops issued between side_begin() and side_end() form a side
  // branch that may run concurrently with the ops issued after side_end(), until side_join(). The defaults
  // run everything in issue order (the CPU). `critical`: the model expects the branch to be the longer one (the
  // join waits for it), a hint a backend may act on (the CUDA backend's TERN_BRANCH_PRIORITY).
  virtual void side_begin(bool critical) { (void)critical; }
  virtual void side_end() {}
  virtual void side_join() {}

 protected:
  [[noreturn]] void no_kernel(std::string_view op, DType dtype) const;
  [[noreturn]] void no_kernel(std::string_view op, std::string_view what) const;
};

}  // namespace tern::ops
