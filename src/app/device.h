// Where a verb runs the model (--device cpu | cuda): the checks, the backend registration and the weight
// upload that `tern run` and `tern serve` share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/v4_model.h"

namespace tern::app {

struct Placement {
  std::string device = "cpu";
  std::string description;       // "2 CPU threads" or "cuda: NVIDIA H200, ..., 123 MiB of weights"
  int64_t weight_bytes = 0;      // bytes uploaded to the device (0 on the CPU)
  std::shared_ptr<void> keep;    // owns the device copies of the weights: keep it alive with the model
};

// Registers the backends for `device` ("cpu" or "cuda"), or throws saying why it cannot run here: an
// unknown name, no GPU, a GPU other than Hopper, a build without the CUDA backend. Call before loading.
void prepare_device(const std::string& device);
// The explicit context a model's ops run in on the device prepared above (ops/context.h): its backend and
// memory.
ops::Context device_context(const std::string& device);
// Moves the model to the device prepared above (the weights stay put on the CPU) and gives it device_context.
Placement place_model(model::Model& m, const std::string& device);
// Kernel options of the verbs that run a model (verb.h adds them to a command line).
struct TuneOptions {
  std::string mode = "off", cache;
  bool batch_invariant = false;
  std::string activations = "auto";
};
// --activations: "native", "fp8", "f32" (the exact mode: every product exact in f32, slow) or "auto" (the default): fp8 on a GPU (the official reference's activations, and
// faster there: results.md session 13), native on the CPU (tern's f32 reference numerics). Throws naming a bad value.
ops::Activations resolve_activations(const std::string& flag, const std::string& device);
// Kernel choices for a model: --activations native|fp8|auto (ops/act_quant.h; every device), and on the GPU
// --batch-invariant (every product on tern's own kernels, or products of many tokens on cuBLAS) and tuning
// (--tune off|cached|on, --tune-cache; docs/cuda-backend.md, "Tuning"): "cached" runs the linears with the
// tuning table's choices, "on" also measures what the table lacks and saves it, "off" keeps the built-in
// rule. Returns the lines to log. Call before the model's first forward; throws naming a bad mode or an
// unusable table file.
std::vector<std::string> configure_kernels(model::Model& m, const std::string& device, const TuneOptions& t);
// --kv-mode: "exact" (f32 state rows: tern's reference numerics; on the GPU the attention runs on CUDA cores, 3-4x
// slower prefill), "fp8" (DeepSeek's FP8 rows: the tensor-core attention kernels) or "auto" (the default of run
// and serve): fp8 on a GPU, exact on the CPU. Throws naming a bad value. `note` gets the line to log.
model::KvMode parse_kv_mode(const std::string& flag, const std::string& device, std::string* note);
// "141.0 GiB total: 1.2 GiB weights, 64 MiB workspace, 120.3 GiB free" for a device placement.
std::string device_memory_report(const Placement& p);
// Bytes free where the sequence states will live: the GPU's free memory, or the host's available memory.
int64_t free_state_memory(const std::string& device);

}  // namespace tern::app
