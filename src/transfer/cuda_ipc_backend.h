// The CUDA IPC backend (CUDA builds only; library tern_transfer_gpu): a landing is device memory of the
// decode process, exported with cudaIpcGetMemHandle; the prefill process (same host, same or another
// GPU with peer access) opens the handle and copies its segments (device or host memory) into it with
// one cudaMemcpy each. The descriptor carries the host's boot id, so a prefill process on another host
// refuses it instead of writing garbage. Copies are synchronous: when send() reports success the bytes
// are in the decode process's memory, and the control channel's `done` orders the import after them.
#pragma once

#include <memory>

#include "transfer/backend.h"

namespace boost::asio {
class io_context;
}

namespace tern::transfer {

struct CudaIpcOptions {
  int device = 0;  // where landings are allocated (decode side) / copies are issued (prefill side)
};

// Throws tern::Error when CUDA is unusable (no device, driver error).
std::unique_ptr<Backend> make_cuda_ipc_backend(boost::asio::io_context& io, CudaIpcOptions options);

// A landing's device memory (for the tests and a device-side import); nullptr for other backends.
void* landing_device_pointer(Landing& landing);

}  // namespace tern::transfer
