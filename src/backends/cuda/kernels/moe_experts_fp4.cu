// Instantiations of the expert kernels for: mxfp4 nvfp4.
#include "backends/cuda/kernels/moe_impl.cuh"

namespace tern::cuda {
template void launch_moe_experts<WeightFormat::mxfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_experts<WeightFormat::nvfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
}  // namespace tern::cuda
