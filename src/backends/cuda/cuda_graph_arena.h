// The CUDA backend's recorded steps (ops/recorded_steps.h): the activation arena that the backend's step memory
// (CudaBackend::step_memory: the context's tensors and the ops' transients) takes from while a scope is open, and
// CUDA graph capture / replay on the backend's stream (hence the file's name: graph arena, not the interface's
// "recorded steps"). Owned by its CudaBackend (CudaBackend::step_graphs), reached through the backend's context.
// Host compiler; includes the runtime API (internal to the backend).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device_memory.h"
#include "core/arena_plan.h"
#include "ops/recorded_steps.h"

namespace tern::cuda {

// Called with each captured step graph before it is instantiated, where set: the profiler sets it (profiler.h,
// trace_graph_edges: the graph's edges into TERN_PROFILE_TRACE), so the backend itself never links CUPTI.
using GraphCapturedHook = void (*)(cudaGraph_t graph);
void set_graph_captured_hook(GraphCapturedHook hook);

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

  // For the step memory (cuda_backend.cpp, the only caller): an arena block while a (non-measuring) scope is open, else nullptr; in a
  // measuring scope, plans the block and returns nullptr (the pool serves it: measured() then binds the pool's
  // pointer to the planned block). Blocks are placed by an ArenaPlan (core/arena_plan.h): a freed block is reused
  // within the step, so the arena is the step's peak of live tensors. Arena blocks are handed out only inside
  // capture(); a block that asked for zeros (`zero`), or for the activation fill (CudaBackend::activation_fill: by
  // default none), is filled by the recorded graph's first nodes when no earlier block of the step used its bytes,
  // else by a memset node where it is allocated.
  void* allocate(size_t bytes, bool zero);
  void measured(void* p);
  // A tensor's memory is freed: true when p is an arena address (the pool must not free it); a block of the open
  // scope goes back to the plan (never throws: a deleter calls it; a bad release fails the scope at its end). An
  // earlier scope's tensor kept by its caller (a recorded step's outputs) may share the address of an open block:
  // those die only between scopes, so inside one the address is the open block's.
  bool release(const void* p) noexcept;
  // Side branches (CudaBackend::side_begin / side_join): blocks freed while one is pending wait for the join.
  void branch_begin();
  void branch_join();
  bool owns(const void* p) const;
  // Inside capture(): the backend's pool refuses to allocate then (a tensor outside the arena).
  bool capturing() const { return capturing_; }

 private:
  void fill_arena_first(cudaGraph_t graph);

  struct Fill {  // an arena range the graph fills with `value` before its other nodes
    size_t offset, bytes;
    int value;
  };

  CudaBackend& backend_;
  bool reuse_ = true;  // TERN_ARENA_REUSE
  DeviceBuffer arena_;
  ArenaPlan plan_;
  std::unordered_map<const void*, size_t> blocks_;  // the open scope's live blocks: address -> planned offset
  size_t planned_ = 0;                               // a measuring scope's last planned offset, until measured()
  bool has_planned_ = false;
  std::string release_error_;                        // a bad release in the open scope (reported at its end)
  std::vector<Fill> fills_;  // this capture's, in allocation order
  bool open_ = false, measure_ = false, capturing_ = false;
  uint64_t arena_generation_ = 0;
  size_t graph_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  std::vector<cudaGraphExec_t> execs_;
};

}  // namespace tern::cuda
