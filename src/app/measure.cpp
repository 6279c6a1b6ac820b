#include "app/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>
#include <vector>

#include "app/device.h"
#include "core/error.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/synth.h"
#include "ops/synth_values.h"
#if TERN_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/profiler.h"
#include "backends/cuda/timing.h"
#endif

namespace tern::app {

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

// Filled on ctx's backend (the model's or the measurement's own context).
Tensor random_tensor(const ops::Context& ctx, DType t, Shape s, uint64_t seed, float sigma) {
  Tensor x(t, s, ctx.device());
  ops::SynthFillArgs a;
  a.kind = ops::SynthKind::normal;
  a.seed = seed;
  a.b = sigma;
  a.out = x;
  ops::synth_fill(ctx, a);
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
  const ops::Context ctx = device_context(device);
  const auto sigma = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  Tensor x = random_tensor(ctx, DType::f32, {n, n}, 11, 1.0f), y(DType::f32, {n, n}, d);
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
    ops::synth_fill(ctx, a);
    w.scale = scale;
  } else {
    w.format = ops::WeightFormat::bf16;
    weight = random_tensor(ctx, DType::bf16, {n, n}, 12, sigma);
  }
  w.weight = weight;
  const StepTiming t = time_steps(device, [&] { ops::linear(ctx, x, w, y); }, 1, 5);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (t.median_us * 1e6);
}

#if TERN_WITH_CUDA
namespace {

// "layers.3.attn.wq_a.weight" -> "attn.wq_a"
std::string short_name(const std::string& name) {
  std::string n = name;
  if (n.rfind("layers.", 0) == 0) {
    const size_t dot = n.find('.', 7);
    if (dot != std::string::npos) n = n.substr(dot + 1);
  }
  const std::string suffix = ".weight";
  if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
    n.resize(n.size() - suffix.size());
  return n;
}

}  // namespace

std::vector<GemmRate> prefill_gemm_rates(const model::Model& m, const std::string& device, int64_t T) {
  if (device != "cuda") return {};
  cuda::CudaBackend& b = cuda::register_backend();
  const int reps = 3;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, bool>;
  std::map<Key, std::pair<const ops::LinearUse*, int>> shapes;
  const std::vector<ops::LinearUse> uses = m.linears();
  std::vector<Key> order;
  for (const ops::LinearUse& u : uses) {
    const ops::Weight& w = *u.weight;
    if (w.out > 65536) continue;  // the head: one row per prompt
    const Key k{static_cast<int>(w.format), w.out, w.in, u.groups, w.exact};
    auto [it, fresh] = shapes.try_emplace(k, &u, 0);
    if (fresh) order.push_back(k);
    ++it->second.second;
  }
  std::vector<GemmRate> rows;
  for (const Key& k : order) {
    const auto& [use, count] = shapes.at(k);
    const ops::Weight& w = *use->weight;
    const int64_t groups = use->groups, in = w.in * groups;
    Tensor x = random_tensor(m.context(), DType::f32, {T, in}, 31, 1.0f), y(DType::f32, {T, w.out}, Device::cuda);
    const StepTiming t = time_steps(device, [&] {
      if (groups > 1) ops::grouped_linear(m.context(), x.view().reshape({T, groups, w.in}), w, y.view().reshape({T, groups, w.out / groups}));
      else ops::linear(m.context(), x, w, y);
    }, 1, reps);
    GemmRate r;
    r.what = cat(short_name(w.name), " ", ops::weight_format_name(w.format), w.exact ? " exact" : "", " ", w.out, "x",
                 w.in, groups > 1 ? cat(" in ", groups, " groups") : std::string(), " (x", count, ")");
    r.flops = 2.0 * static_cast<double>(T) * static_cast<double>(w.out) * static_cast<double>(w.in);
    r.op_us = t.median_us;
    r.library_us = b.library_gemm_us(T, w.out, w.in, w.exact, reps);
    rows.push_back(r);
  }
  // The routed experts of layer 0, uniform random routing (distinct picks per token).
  const model::ModelConfig& c = m.config();
  const std::span<const ops::Expert> experts = m.routed_experts(0);
  if (!experts.empty()) {
    const int64_t E = static_cast<int64_t>(experts.size()), k = c.experts_per_token, D = c.hidden_size;
    const int64_t inter = experts[0].w1.out;
    Tensor idx(DType::i32, {T, k});
    uint64_t state = 0x1234;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> all(static_cast<size_t>(E));
      std::iota(all.begin(), all.end(), 0);
      for (int64_t j = 0; j < k; ++j) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        std::swap(all[j], all[j + static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(E - j))]);
        idx.data<int32_t>()[t * k + j] = all[j];
      }
    }
    Tensor didx = Tensor::copy_of(idx, Device::cuda);
    Tensor x = random_tensor(m.context(), DType::f32, {T, D}, 32, 1.0f);
    Tensor w = random_tensor(m.context(), DType::f32, {T, k}, 33, 0.3f), out(DType::f32, {T, D}, Device::cuda);
    const StepTiming t = time_steps(device, [&] {
      ops::moe_experts(m.context(), ops::MoeExpertsArgs{x, didx, w, experts, static_cast<float>(c.swiglu_limit), out});
    }, 1, reps);
    GemmRate r;
    r.what = cat("routed experts ", ops::weight_format_name(experts[0].w1.format), " ", E, " x (w1|w3 ", inter, "x", D,
                 ", w2 ", D, "x", inter, "), top-", k, " (x", c.num_layers, ")");
    r.flops = 2.0 * static_cast<double>(T * k) * 3.0 * static_cast<double>(inter) * static_cast<double>(D);
    r.op_us = t.median_us;
    r.library_us = b.library_moe_us(T, E, k, D, inter, reps);
    rows.push_back(r);
  }
  return rows;
}

struct StepProfiler::Impl {
  cuda::Profiler profiler;
  cuda::ProfileReport report;
};
StepProfiler::StepProfiler(const std::string& device) {
  TERN_CHECK(device == "cuda", "--profile measures GPU kernels: use it with --device cuda");
  impl_ = std::make_unique<Impl>();
}
void StepProfiler::start() { impl_->profiler.start(); }
void StepProfiler::pause() {
  impl_->profiler.stop();
  impl_->report = cuda::categorize(impl_->profiler.records());
}
std::string StepProfiler::json(int64_t steps, int top) const { return cuda::format_report_json(impl_->report, steps, top); }
std::string StepProfiler::stop(int64_t steps, const std::string& what, int64_t layers, int top) {
  pause();
  return report(steps, what, layers, top);
}
std::string StepProfiler::report(int64_t steps, const std::string& what, int64_t layers, int top) const {
  const cuda::ProfileReport& r = impl_->report;
  std::string s = cuda::format_report(r, steps, top, what);
  if (layers > 0 && steps > 0) {
    const int64_t launches = cuda::total_count(r);
    char buf[160];
    std::snprintf(buf, sizeof buf, "kernel launches: %.0f per %s, %.1f per layer (%ld layers)\n",
                  static_cast<double>(launches) / static_cast<double>(steps), what.c_str(),
                  static_cast<double>(launches) / static_cast<double>(steps) / static_cast<double>(layers),
                  static_cast<long>(layers));
    s += buf;
  }
  return s;
}
#else
std::vector<GemmRate> prefill_gemm_rates(const model::Model&, const std::string&, int64_t) { return {}; }
struct StepProfiler::Impl {};
StepProfiler::StepProfiler(const std::string&) {
  fail("--profile measures GPU kernels: this tern was built without the CUDA backend");
}
void StepProfiler::start() {}
void StepProfiler::pause() {}
std::string StepProfiler::report(int64_t, const std::string&, int64_t, int) const { return {}; }
std::string StepProfiler::json(int64_t, int) const { return {}; }
std::string StepProfiler::stop(int64_t, const std::string&, int64_t, int) { return {}; }
#endif
StepProfiler::~StepProfiler() = default;

}  // namespace tern::app

namespace tern::app {

std::string set_activation_fill(const std::string& device, const std::string& fill) {
#if TERN_WITH_CUDA
  if (device == "cuda") {
    using F = cuda::CudaBackend::ActivationFill;
    const F was = cuda::CudaBackend::activation_fill();
    cuda::CudaBackend::set_activation_fill(cuda::CudaBackend::parse_activation_fill(fill, "activation fill"));
    return was == F::zero ? "zero" : was == F::poison ? "poison" : "none";
  }
#endif
  (void)device;
  (void)fill;
  return {};
}

}  // namespace tern::app
