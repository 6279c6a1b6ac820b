// Instantiations of the expert kernels for: f32 bf16 fp8.
#include "backends/cuda/kernels/moe_impl.cuh"

namespace tern::cuda {
template void launch_moe_experts<dev::WFmt::f32>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_experts<dev::WFmt::bf16>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_experts<dev::WFmt::fp8>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
}  // namespace tern::cuda
