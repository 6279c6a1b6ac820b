// Programmatic dependent launch (PDL), host interface: the process-wide switch and the fence (definitions in
// launch.cu; the device side and the launch helper are in launch.cuh). Host-includable, no device code.
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

// Whether kernels are launched with the PDL attribute (cudaLaunchAttributeProgrammaticStreamSerialization):
// on unless the environment says TERN_PDL=0 (read once, at the first launch). The setter is for tests and
// benchmarks; a CUDA graph keeps the attribute its kernels were captured with.
bool pdl_enabled();
void set_pdl_enabled(bool on);

// An empty kernel launched WITHOUT the attribute: the next kernel cannot start (so cannot read anything
// before its grid_dependency_wait) until every kernel before the fence has completed and its writes are
// visible. Needed after a kernel that writes what a later kernel reads before its wait: weights
// (CudaBackend::synth_fill).
void launch_pdl_fence(cudaStream_t stream);

}  // namespace tern::cuda
