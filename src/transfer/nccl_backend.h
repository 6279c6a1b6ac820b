// The NCCL backend (CUDA builds with NCCL only; library tern_transfer_gpu): point-to-point between two
// GPUs of one host or of two hosts. A landing is device memory plus a fresh NCCL unique id; the decode
// side joins a two-rank communicator as rank 1 and posts ncclRecv into the landing, the prefill side
// joins as rank 0 and ncclSends its segments (staged into one device buffer when they are on the host).
// Both sides initialize non-blocking and poll, so a landing dropped or a send cancelled before the peer
// joins aborts its communicator instead of hanging. One communicator per transfer keeps the backend small;
// its setup cost (tens of ms) is what a per-peer communicator cache would remove.
#pragma once

#include <chrono>
#include <memory>

#include "transfer/backend.h"

namespace boost::asio {
class io_context;
}

namespace tern::transfer {

struct NcclOptions {
  int device = 0;
  std::chrono::milliseconds timeout{30000};  // for the peer to join and the bytes to move
};

std::unique_ptr<Backend> make_nccl_backend(boost::asio::io_context& io, NcclOptions options);

}  // namespace tern::transfer
