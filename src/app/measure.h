// What `tern bench-step` measures on the device itself, in the same run as the model (docs/bench-step.md):
// step timing (CUDA events on the GPU, the wall clock on the CPU), the copy bandwidth and a big GEMM through
// tern's own linear op, and the GPU profiler's per-category breakdown.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/v4_model.h"

namespace tern::app {

struct StepTiming {
  double median_us = 0, min_us = 0, max_us = 0;
  int runs = 0;
};
// fn() `warmup` times, then `runs` timed calls; per call. On the GPU each call is bracketed by CUDA events on
// the backend's stream (what fn issues there, and the host gaps between its launches); on the CPU, wall clock.
StepTiming time_steps(const std::string& device, const std::function<void()>& fn, int warmup, int runs);

// Device-to-device copy bandwidth (read + write counted) of a `bytes` buffer; on the CPU, memcpy.
double copy_bandwidth_gbs(const std::string& device, int64_t bytes);

// y [n, n] = x [n, n] W^T through ops::linear with W bf16 or fp8_block (fp8 true), random values: TFLOP/s.
double linear_tflops(const std::string& device, int64_t n, bool fp8);

// Each distinct linear shape of the model (the head excepted: a prefill computes one row of it) and the
// routed experts of layer 0, at T prompt tokens: the op as the model runs it, against the library's own
// product on the same shape in the same run (bf16, or f32 for exact weights; for the experts, the grouped
// products on experts already in bf16). CUDA only; empty elsewhere.
struct GemmRate {
  std::string what;  // "wq_a fp8_block 1024x4096 (x43)"
  double flops = 0, op_us = 0, library_us = 0;
};
std::vector<GemmRate> prefill_gemm_rates(const model::Model& m, const std::string& device, int64_t T);

// What the forward's uninitialised activations hold on the GPU: "none", "zero" or "poison" (NaN bytes). Returns
// the fill it replaced, or "" on the CPU (host tensors are always zeroed; nothing is set).
std::string set_activation_fill(const std::string& device, const std::string& fill);

// The GPU profiler (CUPTI) around a few steps; throws on the CPU or when CUPTI is unavailable.
class StepProfiler {
 public:
  explicit StepProfiler(const std::string& device);
  ~StepProfiler();
  void start();
  // Stops recording; report() and json() read what was recorded since start().
  void pause();
  // The per-step table (op categories, top kernels, busy / wall); with `layers` > 0 also the kernel launches
  // per step and per layer (launch gaps are what a small batch loses between kernels).
  std::string report(int64_t steps, const std::string& what, int64_t layers = 0, int top = 12) const;
  // The same figures as JSON (profile_report.h's format_report_json), `top` kernels.
  std::string json(int64_t steps, int top) const;
  // pause(), then report().
  std::string stop(int64_t steps, const std::string& what, int64_t layers = 0, int top = 12);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tern::app
