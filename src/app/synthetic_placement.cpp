#include "app/synthetic_placement.h"

#include <chrono>

#include "app/device.h"
#include "core/error.h"
#if TERN_WITH_CUDA
#include "backends/cuda/device_memory.h"
#endif

namespace tern::app {

model::ModelConfig synthetic_config(const std::string& name) {
  if (name == "full") return model::ModelConfig::v4_flash();
  if (name == "tiny") return model::ModelConfig::tiny();
  fail("synthetic config: expected full (V4-Flash) or tiny, found \"", name, "\"");
}

SyntheticPlacement place_synthetic_model(const model::ModelConfig& config, model::WeightFormat experts,
                                         model::KvMode kv_mode, const std::string& device, int64_t reserve_bytes,
                                         uint64_t seed) {
  SyntheticPlacement p;
  const Device d = device == "cuda" ? Device::cuda : Device::cpu;
  const int64_t free_bytes = free_state_memory(device);
  model::SyntheticModelOptions o;
  o.seed = seed;
  o.experts = experts;
  o.weight_budget_bytes = std::max<int64_t>(0, free_bytes - reserve_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  model::SyntheticModel built = model::build_synthetic_model(config, device_context(device), o);
  p.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.sharing = built.sharing;
  p.sizes = built.sizes;
  p.model = std::make_shared<model::Model>(std::move(built.weights), kv_mode, device_context("cpu"));
  // The views are on the device already: moving the model there only switches where it computes.
  if (d != Device::cpu) p.model->to_device(d, [](const TensorView& v) { return v; });
  p.model->set_context(device_context(device));
  const auto gib = [](int64_t b) { return static_cast<double>(b) / (1 << 30); };
  std::string where = cat("host memory, ", gib(free_bytes), " GiB available");
#if TERN_WITH_CUDA
  if (d == Device::cuda) {
    const auto m = cuda::device_memory_info();
    where = cat(cuda::device_description(), ", ", gib(m.total_bytes), " GiB card, ", gib(m.free_bytes),
                " GiB free after the weights");
  }
#endif
  p.description = cat("synthetic weights (seed ", seed, ", ", model::weight_format_name(experts), " experts, built in ",
                      p.build_seconds, " s): ", p.sharing.description, "; ", where, "; ", gib(reserve_bytes),
                      " GiB reserved for states, activations and graphs");
  return p;
}

int64_t state_bytes_per_sequence(const model::ModelConfig& config, model::KvMode kv_mode, int64_t max_tokens) {
  // A model without weights knows its state layout (the layout is a function of the config and KV mode).
  model::ModelWeights none;
  none.config = config;
  none.layers.resize(static_cast<size_t>(config.num_layers));
  const model::Model m(std::move(none), kv_mode, device_context("cpu"));
  const auto layout = m.state_layout(max_tokens);
  return layout->pages_for(max_tokens) * layout->page_bytes();
}

}  // namespace tern::app
