// The CUDA backend's recorded steps (ops/recorded_steps.h): the activation arena that core's device tensors
// come from while a scope is open, and CUDA graph capture / replay on the backend's stream (hence the
// file's name: graph arena, not the interface's "recorded steps").
// Host compiler; includes the runtime API (internal to the backend).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "ops/recorded_steps.h"

namespace tern::cuda {

class CudaStepGraphs final : public ops::StepGraphs {
 public:
  explicit CudaStepGraphs(CudaBackend& backend);
  ~CudaStepGraphs() override;

  void arena_begin(bool measure) override;
  size_t arena_end() override;
  void arena_reserve(size_t bytes) override;
  size_t arena_bytes() const override { return arena_.size(); }
  int capture(const std::function<void()>& body) override;
  void replay(int handle) override;
  void drop_all() override;
  size_t graph_bytes() const override { return graph_bytes_; }
  uint64_t generation() const override;
  void* pinned_host(size_t bytes) override;

  // For the device memory: an arena block while a (non-measuring) scope is open, else nullptr; in a
  // measuring scope, counts `bytes` and returns nullptr (the pool serves it). Arena blocks are handed out
  // only inside capture() and not filled here: the recorded graph's first nodes fill the blocks that asked for
  // zeros (`zero`), and the others as eager allocations are filled (CudaBackend::activation_fill: by default
  // not at all).
  void* allocate(size_t bytes, bool zero);
  bool owns(const void* p) const;

 private:
  void fill_arena_first(cudaGraph_t graph);

  struct Fill {  // an arena range the graph fills with `value` before its other nodes
    size_t offset, bytes;
    int value;
  };

  CudaBackend& backend_;
  DeviceBuffer arena_;
  size_t used_ = 0;
  std::vector<Fill> fills_;  // this capture's, in arena order
  bool open_ = false, measure_ = false, capturing_ = false;
  uint64_t arena_generation_ = 0;
  size_t graph_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  std::vector<cudaGraphExec_t> execs_;
};

// The backend's instance (created and registered for Device::cuda by register_backend()).
CudaStepGraphs& step_graphs();

}  // namespace tern::cuda
