// Instantiations of the bulk-copy expert kernels (moe_bulk_impl.cuh) for: mxfp4 nvfp4.
#include "backends/cuda/kernels/moe_bulk_impl.cuh"

namespace tern::cuda {
template void launch_moe_bulk<WeightFormat::mxfp4>(const MoeParams&, const MoeLayout&, const MoeBulkPlan&,
                                                const MoeBulkPlan&, int, char*, cudaStream_t);
template void launch_moe_bulk<WeightFormat::nvfp4>(const MoeParams&, const MoeLayout&, const MoeBulkPlan&,
                                                const MoeBulkPlan&, int, char*, cudaStream_t);
}  // namespace tern::cuda
