// Instantiations of the tensor-core linear kernel for: mxfp4 nvfp4 (one file per format family keeps nvcc's
// compile units small).
#include "backends/cuda/kernels/linear_impl.cuh"

namespace tern::cuda {
template void launch_linear_mma<WeightFormat::mxfp4>(const LinearParams&, const LinearPlan&, cudaStream_t);
template void launch_linear_mma<WeightFormat::nvfp4>(const LinearParams&, const LinearPlan&, cudaStream_t);
}  // namespace tern::cuda
