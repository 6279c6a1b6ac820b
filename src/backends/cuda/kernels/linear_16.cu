// Instantiations of the tensor-core linear kernel for: f32 bf16 (one file per format family keeps nvcc's
// compile units small).
#include "backends/cuda/kernels/linear_impl.cuh"

namespace tern::cuda {
template void launch_linear_mma<WeightFormat::f32>(const LinearParams&, const LinearPlan&, cudaStream_t);
template void launch_linear_mma<WeightFormat::bf16>(const LinearParams&, const LinearPlan&, cudaStream_t);
}  // namespace tern::cuda
