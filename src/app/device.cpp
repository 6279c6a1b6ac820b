#include "app/device.h"

#include <fstream>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#if TERN_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#endif

namespace tern::app {
namespace {

int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return int64_t{4} << 30;
}

}  // namespace

void prepare_device(const std::string& device) {
  TERN_CHECK(device == "cpu" || device == "cuda", "--device: expected cpu or cuda, found \"", device, "\"");
  if (device == "cpu") return;
#if TERN_WITH_CUDA
  TERN_CHECK(cuda::device_available(), "--device cuda: no CUDA device on this machine (",
             cuda::device_description(), ")");
  cuda::register_backend();  // throws for a GPU other than sm_90 (Hopper)
#else
  fail("--device cuda: this tern was built without the CUDA backend (configure with -DTERN_CUDA=ON on a "
       "machine with the CUDA toolkit)");
#endif
}

ops::Context device_context(const std::string& device) {
  if (device == "cpu") return cpu::context();
#if TERN_WITH_CUDA
  TERN_CHECK(device == "cuda", "--device: expected cpu or cuda, found \"", device, "\"");
  return cuda::context();
#else
  prepare_device(device);  // throws
  fail("unreachable");
#endif
}

Placement place_model(model::Model& m, const std::string& device) {
  Placement p;
  p.device = device;
  p.description = cat(thread_count(), " CPU threads");
  if (device == "cpu") {
    m.set_context(device_context(device));
    return p;
  }
#if TERN_WITH_CUDA
  auto store = std::make_shared<cuda::WeightStore>();
  m.to_device(Device::cuda, [&](const TensorView& v) { return store->upload(v); });
  m.set_context(device_context(device));
  p.weight_bytes = static_cast<int64_t>(store->bytes());
  p.description = cat("cuda: ", cuda::device_description(), ", ", static_cast<double>(p.weight_bytes) / (1 << 20),
                      " MiB of weights on the device");
  p.keep = std::move(store);
#else
  (void)m;
  prepare_device(device);  // throws
#endif
  return p;
}

ops::Activations resolve_activations(const std::string& flag, const std::string& device) {
  if (flag == "auto") return device == "cuda" ? ops::Activations::fp8 : ops::Activations::native;
  return ops::parse_activations(flag);
}

std::vector<std::string> configure_kernels(model::Model& m, const std::string& device, const TuneOptions& t) {
  const std::string& mode = t.mode;
  const std::string& cache_path = t.cache;
  const bool batch_invariant = t.batch_invariant;
  TERN_CHECK(mode == "off" || mode == "cached" || mode == "on", "--tune: expected off, cached or on, found \"", mode,
             "\"");
  m.set_activations(resolve_activations(t.activations, device));
  std::vector<std::string> lines;
  switch (m.activations()) {
    case ops::Activations::fp8:
      lines.emplace_back("activations fp8: x quantised to e4m3 in 1x128 blocks (power-of-two scales) before each FP8 "
                         "product and the routed experts' products, as the official reference; bf16 products keep "
                         "their own");
      break;
    case ops::Activations::f32:
      lines.emplace_back("activations f32 (the exact mode): every product exact in f32 on every device, the GPU's on its "
                         "exact kernels (slow: for checks, not serving)");
      break;
    case ops::Activations::native:
      lines.emplace_back("activations native (FP8 products take x as f32 on the CPU, bf16 on the GPU's tensor cores)");
      break;
  }
  if (device != "cuda") return lines;
#if TERN_WITH_CUDA
  cuda::CudaBackend& b = cuda::register_backend();
  b.set_batch_invariant(batch_invariant);
  lines.push_back(batch_invariant ? std::string("batch invariant: every product on tern's own kernels (a token's "
                                                "logits do not depend on the other tokens of its step)")
                                  : cat("products of >= ", cuda::CudaBackend::library_min_tokens(),
                                        " tokens (prefill chunks) on cuBLAS (library GEMMs) and FP4 experts from ",
                                        b.moe_grouped_min_tokens(), " tokens on the grouped kernels: not batch "
                                        "invariant (--batch-invariant keeps every product on tern's decode kernels)"));
  if (mode == "off") return lines;
  const std::string device_name = b.tune_device();
  const std::string path = cache_path.empty() ? cuda::default_tune_path(device_name) : cache_path;
  cuda::TuneTable table = cuda::TuneTable::load(path, device_name);
  const std::vector<ops::LinearUse> linears = m.linears();
  const cuda::CudaBackend::TuneSummary s = b.tune_linears(linears, table, mode == "on");
  if (s.measured > 0) table.save(path);
  lines.push_back(cat("tuning (", mode, ", ", path, "): ", s.shapes, " streamed linear shapes over ", s.weights,
                      " weights; ", s.from_table, " from the table, ", s.measured, " measured in ", s.seconds, " s",
                      s.shapes - s.from_table - s.measured > 0
                          ? cat("; ", s.shapes - s.from_table - s.measured, " not in the table keep the built-in rule")
                          : std::string()));
  for (const auto& c : s.choices) lines.push_back(cat("tuned ", c));
  return lines;
#else
  (void)cache_path;
  (void)batch_invariant;
  return lines;
#endif
}

std::string device_memory_report(const Placement& p) {
#if TERN_WITH_CUDA
  if (p.device == "cuda") {
    const auto m = cuda::device_memory_info();
    const auto gib = [](int64_t b) { return static_cast<double>(b) / (1 << 30); };
    const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    return cat(gib(m.total_bytes), " GiB total: ", mib(p.weight_bytes), " MiB weights, ",
               mib(static_cast<int64_t>(cuda::register_backend().workspace_bytes())), " MiB op workspace, ",
               gib(m.free_bytes), " GiB free (sequence states and activations come from the rest)");
  }
#endif
  return "host memory (no device)";
}

model::KvMode parse_kv_mode(const std::string& flag, const std::string& device, std::string* note) {
  TERN_CHECK(flag == "auto" || flag == "exact" || flag == "fp8", "--kv-mode: expected auto, exact or fp8, found \"",
             flag, "\"");
  const bool gpu = device != "cpu";
  const bool fp8 = flag == "fp8" || (flag == "auto" && gpu);
  if (note != nullptr) {
    const std::string how = flag == "auto" ? cat(" (--kv-mode auto on ", device, ")") : std::string();
    *note = fp8 ? cat("kv mode fp8", how, ": DeepSeek's FP8 state rows",
                      gpu ? "; attention on tensor cores" : "")
                : cat("kv mode exact", how, ": f32 state rows (tern's reference numerics)",
                      gpu ? "; on the GPU attention runs on CUDA cores in f32 (prefill 3-4x slower than --kv-mode fp8)"
                          : "");
  }
  return fp8 ? model::KvMode::fp8 : model::KvMode::exact;
}

int64_t free_state_memory(const std::string& device) {
#if TERN_WITH_CUDA
  if (device == "cuda") return cuda::device_memory_info().free_bytes;
#endif
  (void)device;
  return host_available_bytes();
}

}  // namespace tern::app
