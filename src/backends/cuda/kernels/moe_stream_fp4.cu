// Instantiations of the streaming expert kernels for: mxfp4 nvfp4.
#include "backends/cuda/kernels/moe_stream_impl.cuh"

namespace tern::cuda {
template void launch_moe_stream<dev::WFmt::mxfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
template void launch_moe_stream<dev::WFmt::nvfp4>(const MoeParams&, const MoeLayout&, char*, cudaStream_t);
}  // namespace tern::cuda
