// The CPU backend: the reference implementation of every op. Plain loops, fp32 arithmetic with fp32 (or
// wider) accumulation, threaded with tern::parallel_for over output rows, tokens or heads. GPU kernels
// are tested against these.
#pragma once

#include "ops/backend.h"
#include "ops/context.h"

namespace tern::cpu {

class CpuBackend;
// The CPU backend's one instance (more may be made: a test's own).
CpuBackend& backend();
// The context of backend() (ops/context.h): what tests, tools and app::device_context run host ops in.
const ops::Context& context();

class CpuBackend final : public ops::Backend {
 public:
  CpuBackend() = default;
  // A CPU backend standing in for a device (tests: host memory labelled Device::cuda, tests/model/test_device.cpp):
  // the device tensors its step ops make for themselves come from `stand_in` (as the CUDA backend's come from its
  // step memory: CudaBackend::Impl::tensor); nullptr: from the device's registered memory (core/tensor.h).
  explicit CpuBackend(DeviceMemory* stand_in) : stand_in_(stand_in) {}
  std::string_view name() const override { return "cpu"; }
  std::vector<std::string> kernel_paths() const override;

  void embedding(const TensorView& table, const TensorView& ids, const TensorView& out) override;
  void add(const TensorView& x, const TensorView& y) override;
  void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& out) override;
  void gather_rows(const TensorView& x, const TensorView& rows, const TensorView& out) override;
  void rms_norm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  void rope(const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
            bool inverse) override;
  void linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override;
  void grouped_linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override;
  void act_quant_rows(const TensorView& x, const ops::Fp8Rows& out) override;
  void grouped_linear_fp8(const ops::Fp8Rows& x, int64_t groups, const ops::Weight& w, const TensorView& y) override;
  void dequantize(const ops::Weight& w, const TensorView& out) override;
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
  void route_scored(const TensorView& logits, const TensorView& bias, float routed_scale,
                    const TensorView& indices, const TensorView& weights) override;
  void route_hash(const TensorView& logits, const TensorView& tid2eid, const TensorView& token_ids,
                  float routed_scale, const TensorView& indices, const TensorView& weights) override;
  void moe_experts(const ops::MoeExpertsArgs& a) override;
  void synth_fill(const ops::SynthFillArgs& a) override;  // synth.cpp
  // step.cpp: the batched steps, each active slot through the eager op above
  void step_attention(const ops::StepAttentionArgs& a, const TensorView& out) override;
  void step_compressor(const ops::StepCompressorArgs& a) override;
  void step_compress_emit(const ops::StepCompressEmitArgs& a) override;
  void step_indexer_topk(const ops::StepIndexerArgs& a, int topk, const TensorView& indices) override;
  void store_ring_rows(const TensorView& rows, const TensorView& rings, const TensorView& positions,
                       const TensorView& firsts, int64_t window) override;
  void store_paged_rows(const TensorView& rows, const ops::StepPagedRows& dest, const TensorView& positions,
                        int ratio) override;

 private:
  void require_f32(std::string_view op, std::initializer_list<const TensorView*> views) const;
  // A tensor on `device` for an op's own use: the host's, or the stand-in device's from stand_in_.
  Tensor transient(DType dtype, Shape shape, Device device) const;
  // The context the step ops run their per-sequence ops in: this instance, on `device`, with stand_in_.
  ops::Context own_context(Device device) { return ops::Context(*this, device, stand_in_); }

  DeviceMemory* stand_in_ = nullptr;
};

}  // namespace tern::cpu
