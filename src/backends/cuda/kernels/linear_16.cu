// Instantiations of the tensor-core linear kernel for: f32 bf16 (one file per format family keeps nvcc's
// compile units small).
#include "backends/cuda/kernels/linear_impl.cuh"

namespace tern::cuda {
template void launch_linear_mma<dev::WFmt::f32>(const LinearParams&, const LinearPlan&, cudaStream_t);
template void launch_linear_mma<dev::WFmt::bf16>(const LinearParams&, const LinearPlan&, cudaStream_t);
}  // namespace tern::cuda
