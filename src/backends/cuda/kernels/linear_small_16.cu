// Instantiation of the small-T linear kernel for: bf16 (one file per format keeps nvcc's compile units small).
#include "backends/cuda/kernels/linear_small_impl.cuh"

namespace tern::cuda {
template void launch_linear_small<dev::WFmt::bf16>(const LinearParams&, const SmallLinearPlan&, const uint8_t*, cudaStream_t);
}  // namespace tern::cuda
