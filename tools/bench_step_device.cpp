#include "tools/bench_step_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/linear.h"
#include "ops/synth.h"
#include "ops/synth_values.h"
#if TERN_WITH_CUDA
#include "backends/cuda/profiler.h"
#include "backends/cuda/timing.h"
#endif

namespace tern::tools {

namespace {

Device device_of(const std::string& device) { return device == "cuda" ? Device::cuda : Device::cpu; }

StepTiming wall_clock(const std::function<void()>& fn, int warmup, int runs) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> us;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us.front(), us.back(), runs};
}

Tensor random_tensor(DType t, Shape s, Device d, uint64_t seed, float sigma) {
  Tensor x(t, s, d);
  ops::SynthFillArgs a;
  a.kind = ops::SynthKind::normal;
  a.seed = seed;
  a.b = sigma;
  a.out = x;
  ops::synth_fill(a);
  return x;
}

}  // namespace

StepTiming time_steps(const std::string& device, const std::function<void()>& fn, int warmup, int runs) {
  TERN_CHECK(runs >= 1, "bench-step: at least one timed step");
#if TERN_WITH_CUDA
  if (device == "cuda") {
    const cuda::Timing t = cuda::time_device(fn, warmup, runs);
    return {t.median_us, t.min_us, t.max_us, t.runs};
  }
#endif
  return wall_clock(fn, warmup, runs);
}

double copy_bandwidth_gbs(const std::string& device, int64_t bytes) {
#if TERN_WITH_CUDA
  if (device == "cuda") return cuda::copy_bandwidth_gbs(static_cast<size_t>(bytes), 10);
#endif
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes));
  const StepTiming t = wall_clock([&] { std::memcpy(b.data(), a.data(), a.size()); }, 1, 5);
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e3);
}

double linear_tflops(const std::string& device, int64_t n, bool fp8) {
  const Device d = device_of(device);
  const auto sigma = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  Tensor x = random_tensor(DType::f32, {n, n}, d, 11, 1.0f), y(DType::f32, {n, n}, d);
  ops::Weight w;
  w.out = w.in = n;
  w.name = fp8 ? "bench_gemm_fp8" : "bench_gemm_bf16";
  Tensor weight, scale;
  if (fp8) {
    w.format = ops::WeightFormat::fp8_block;
    weight = Tensor(DType::e4m3, {n, n}, d);
    scale = Tensor(DType::e8m0, {(n + 127) / 128, (n + 127) / 128}, d);
    ops::SynthFillArgs a;
    a.kind = ops::SynthKind::fp8_block;
    a.seed = 12;
    a.b = sigma;
    a.rows = a.cols = n;
    a.out = weight;
    a.scale = scale;
    ops::synth_fill(a);
    w.scale = scale;
  } else {
    w.format = ops::WeightFormat::bf16;
    weight = random_tensor(DType::bf16, {n, n}, d, 12, sigma);
  }
  w.weight = weight;
  const StepTiming t = time_steps(device, [&] { ops::linear(x, w, y); }, 1, 5);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (t.median_us * 1e6);
}

#if TERN_WITH_CUDA
struct StepProfiler::Impl {
  cuda::Profiler profiler;
};
StepProfiler::StepProfiler(const std::string& device) {
  TERN_CHECK(device == "cuda", "--profile measures GPU kernels: use it with --device cuda");
  impl_ = std::make_unique<Impl>();
}
void StepProfiler::start() { impl_->profiler.start(); }
std::string StepProfiler::stop(int64_t steps, const std::string& what) {
  impl_->profiler.stop();
  return cuda::format_report(cuda::categorize(impl_->profiler.records()), steps, 12, what);
}
#else
struct StepProfiler::Impl {};
StepProfiler::StepProfiler(const std::string&) {
  fail("--profile measures GPU kernels: this tern was built without the CUDA backend");
}
void StepProfiler::start() {}
std::string StepProfiler::stop(int64_t, const std::string&) { return {}; }
#endif
StepProfiler::~StepProfiler() = default;

}  // namespace tern::tools
