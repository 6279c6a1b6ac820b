// Instantiations of the tensor-core linear kernel for: fp8 (one file per format family keeps nvcc's
// compile units small).
#include "backends/cuda/kernels/linear_impl.cuh"

namespace tern::cuda {
template void launch_linear_mma<WeightFormat::fp8_block>(const LinearParams&, const LinearPlan&, cudaStream_t);
}  // namespace tern::cuda
