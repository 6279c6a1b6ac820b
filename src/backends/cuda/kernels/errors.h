// Bits of the device error word: data errors a kernel finds that the host could not check without a
// synchronisation (CudaBackend::check_device_errors names them).
#pragma once

namespace tern::cuda {

enum DeviceErrorBit : int {
  kErrTokenId = 1,      // embedding / route_hash: token id outside the table
  kErrExpertIndex = 2,  // moe_experts / route_hash: expert index out of range
  kErrSelected = 4,     // sparse_attention: a selected compressed entry is not visible
  kErrGatherRow = 8,    // gather_rows: row index out of range
  kErrRouterScore = 16,  // route_scored: a token whose every score is NaN (no expert compares)
};

}  // namespace tern::cuda
