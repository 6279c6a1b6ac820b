// Instantiation of the streaming linear kernel for: fp8 (one file per format family keeps nvcc's compile
// units small).
#include "backends/cuda/kernels/linear_stream_impl.cuh"

namespace tern::cuda {
template void launch_linear_stream<WeightFormat::fp8_block>(const LinearParams&, const StreamPlan&, const uint8_t*, cudaStream_t);
}  // namespace tern::cuda
