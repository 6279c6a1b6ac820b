// Kernel launches with programmatic dependent launch (PDL, sm_90), nvcc only. docs/cuda-backend.md, "PDL".
//
// Why: a decode step is about 1 880 short kernels replayed from a CUDA graph, and between two dependent
// kernels the GPU idles while the first one's grid drains and the second one is launched and its blocks are
// placed. A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start before the
// previous kernel of its stream has finished (once every block of that one has called
// grid_dependents_launch() or exited), so its launch, block placement and prologue (barrier set-up, the first
// weight copies) overlap the previous kernel's tail. The price: nothing the previous kernels wrote is safe to
// touch until the kernel has passed griddepcontrol.wait, which returns once the previous grid has COMPLETED
// and its writes are visible.
//
// PDL RULE (every kernel of src/backends/cuda/kernels; tests/unit/test_pdl_rule.cpp checks it):
//   1. Every kernel calls dev::grid_dependency_wait() in every thread, before it reads anything another
//      kernel may have written and before it writes anything (a previous kernel may still be reading the
//      buffer). Default: the FIRST statement of the kernel. No thread may return before it (a grid that
//      finished without waiting would let the kernel after it overtake the one before it).
//   2. The only work before the wait is on data no kernel writes while kernels that may overlap run:
//      arguments, shared memory, and the weights (uploaded by copies; a kernel that writes weights, the
//      synthetic fill, is followed by launch_pdl_fence). Each kernel that does work before its wait says
//      exactly what in a comment containing "before the wait". One exception, argued where it is used: the
//      bulk MoE down kernel reads the plan kernel's job list (written two kernels back) before its wait,
//      which is safe only because the up kernel between them calls grid_dependents_launch() after its own
//      wait (moe_bulk_impl.cuh, "early_down").
//   3. Every launch goes through tern::cuda::launch (no <<<>>>, no other cudaLaunchKernelEx), which adds the
//      attribute when pdl_enabled(). So a kernel can never carry the attribute without the wait.
// grid_dependents_launch() only lets the next kernel be scheduled earlier; correctness does not depend on
// where (or whether) it is called, because the next kernel's wait still waits for this grid to complete, with
// rule 2's one exception: a kernel whose next-but-one reads before its wait what this kernel's predecessor
// wrote (the bulk MoE up kernel) must call it after its own wait.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/kernels/pdl.cuh"

namespace tern::cuda {
namespace dev {

// Waits until the previous kernel of the stream (when this one was launched with PDL) has completed and its
// memory operations are visible; returns at once otherwise.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream (when launched with PDL) be scheduled once every block of this grid has
// called this or exited. The first call in a block counts for the whole block; later ones do nothing.
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The prologue of a kernel that does nothing before its wait: wait, then let the next kernel be scheduled
// (its blocks take the room this grid leaves and wait in turn; it cannot start its own work before this grid
// has completed). Used by the short kernels; the long ones signal later (see docs).
__device__ __forceinline__ void pdl_prologue() {
  grid_dependency_wait();
  grid_dependents_launch();
}

}  // namespace dev

// What a <<<grid, block, smem, stream>>> launch says, plus the few extra attributes a launch site needs.
struct LaunchShape {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  unsigned cluster_x = 0;  // thread-block clusters of cluster_x blocks along x (0: none)
  unsigned cluster_y = 0;  // ... and of cluster_y along y (0: none; either alone makes the other 1)
  bool serial = false;     // never with the PDL attribute (launch_pdl_fence only)
};

// The one way kernels are launched (PDL RULE 3). Arguments are converted to the kernel's parameter types
// as by <<<>>>. Returns the launch's error (also left for cudaGetLastError, so check_launch still sees it).
template <typename... Params, typename... Args>
cudaError_t launch(const LaunchShape& s, void (*kernel)(Params...), Args&&... args) {
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (!s.serial && pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (s.cluster_x > 0 || s.cluster_y > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = s.cluster_x > 0 ? s.cluster_x : 1;
    attrs[n].val.clusterDim.y = s.cluster_y > 0 ? s.cluster_y : 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = s.grid;
  cfg.blockDim = s.block;
  cfg.dynamicSmemBytes = s.smem;
  cfg.stream = s.stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The common case, in <<<>>>'s order: launch(kernel, grid, block, smem, stream, args...).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  return launch(LaunchShape{grid, block, smem, stream}, kernel, std::forward<Args>(args)...);
}

}  // namespace tern::cuda
