// Instantiations of the streaming linear kernel for: mxfp4 nvfp4 (one file per format family keeps nvcc's
// compile units small).
#include "backends/cuda/kernels/linear_stream_impl.cuh"

namespace tern::cuda {
template void launch_linear_stream<WeightFormat::mxfp4>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);
template void launch_linear_stream<WeightFormat::nvfp4>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);
}  // namespace tern::cuda
