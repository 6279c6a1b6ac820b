// The PDL switch (TERN_PDL) and the fence kernel (pdl.cuh, launch.cuh).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "backends/cuda/kernels/launch.cuh"
#include "core/env.h"

namespace tern::cuda {
namespace {

std::atomic<int> g_pdl{-1};  // -1: not read yet

}  // namespace

bool pdl_enabled() {
  int v = g_pdl.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_flag("TERN_PDL", true) ? 1 : 0;
    g_pdl.store(v, std::memory_order_relaxed);
  }
  return v != 0;
}

void set_pdl_enabled(bool on) { g_pdl.store(on ? 1 : 0, std::memory_order_relaxed); }

namespace dev {
namespace {

// Does nothing: its launch (without the attribute) is the fence. It waits all the same (PDL RULE 1).
__global__ void pdl_fence_kernel(int) { grid_dependency_wait(); }

}  // namespace
}  // namespace dev

// Launched whatever the switch says: a kernel before it may have been launched with PDL off and the one after
// it with PDL on (tests and benchmarks flip the switch), and the fence costs one empty kernel.
void launch_pdl_fence(cudaStream_t stream) {
  LaunchShape s{1, 32, 0, stream};
  s.serial = true;
  launch(s, dev::pdl_fence_kernel, 0);
}

}  // namespace tern::cuda
