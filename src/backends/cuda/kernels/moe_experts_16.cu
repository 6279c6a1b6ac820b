// Instantiations of the expert kernels for: f32 bf16 fp8.
#include "backends/cuda/kernels/moe_impl.cuh"

namespace tern::cuda {
template void launch_moe_experts<WeightFormat::f32>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_experts<WeightFormat::bf16>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_experts<WeightFormat::fp8_block>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
}  // namespace tern::cuda
