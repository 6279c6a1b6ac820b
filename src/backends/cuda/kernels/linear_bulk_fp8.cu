// Instantiation of the bulk-copy linear kernel for: fp8 block (one file per format keeps nvcc's compile units
// small).
#include "backends/cuda/kernels/linear_bulk_impl.cuh"

namespace tern::cuda {
template void launch_linear_bulk<WeightFormat::fp8_block>(const LinearParams&, const BulkLinearPlan&, const uint8_t*, cudaStream_t);
}  // namespace tern::cuda
