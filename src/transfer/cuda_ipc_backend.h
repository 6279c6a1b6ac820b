// The CUDA IPC backend (CUDA builds only; library tern_transfer_gpu): a landing is device memory of the
// decode process, exported with cudaIpcGetMemHandle; the prefill process (same host, same or another
// GPU with peer access) opens the handle and copies its segments (device or host memory) into it on a
// stream of its own. Landing buffers are reused (their handles stay valid) and the prefill side keeps
// the handles it opened, so a transfer costs its copy, not an allocation and a mapping. The descriptor
// carries the host's boot id, so a prefill process on another host refuses it instead of writing
// garbage. When send() reports success the bytes are in the decode process's memory, and the control
// channel's `done` orders the import (a device-to-device copy into the state's pages) after them.
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

}  // namespace tern::transfer
