// The data path of a PD server's state transfers (docs/disaggregation.md, "Transfer backends"): tcp everywhere;
// cuda-ipc (GPUs of one host) and nccl (GPU to GPU) in CUDA builds, for a model on the GPU. `tern serve --role
// prefill|decode --pd-backend NAME` picks it here, where the CUDA backend's presence is known at compile time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transfer/backend.h"
#include "transfer/pd_common.h"

namespace boost::asio {
class io_context;
}

namespace tern::app {

struct PdBackendChoice {
  std::string name = "tcp";  // --pd-backend: tcp, cuda-ipc or nccl
  std::string device;        // the model's: cuda-ipc and nccl move device memory
  std::string bind_host;     // tcp: the address to bind or connect from
  uint16_t port = 0;         // tcp: the data port
  bool listen = false;       // tcp: the decode side listens
};

// The backend, or throws naming why it cannot be had here (an unknown name, a model on the CPU, a build without
// the CUDA backend or NCCL). Timeouts come from `options` (the channel's and the transfer's).
std::unique_ptr<transfer::Backend> make_pd_backend(const PdBackendChoice& c, const transfer::PdOptions& options,
                                                   boost::asio::io_context& io);

}  // namespace tern::app
