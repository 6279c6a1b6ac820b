// How the state bytes of one transfer move from the prefill process into memory the decode process
// reserved for them. The control channel (channel.h) says when; a backend says how:
//   decode side:  land(bytes)  -> a Landing (the reserved memory) and its descriptor, sent to the prefill
//                                 side in the `ready` frame;
//   prefill side: send(descriptor, segments) writes the segments back to back into that memory and
//                 reports completion; then the control channel says `done`.
// Backends: "tcp" (host memory over a TCP connection; everywhere, tcp_backend.h), "cuda-ipc" (device
// memory of another process on the same host, cudaIpc*), "nccl" (point-to-point send/recv between GPUs);
// the last two exist in CUDA builds only (cuda_ipc_backend.h, nccl_backend.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tern::transfer {

using Segment = std::span<const std::byte>;

// Memory reserved on the decode side for one transfer. Destroying it cancels the transfer: a write in
// progress fails on the prefill side and the memory is returned.
class Landing {
 public:
  virtual ~Landing() = default;
  virtual std::string descriptor() const = 0;  // how the prefill side reaches this memory
  virtual size_t size() const = 0;
  // True once every byte arrived (checked when the prefill side says `done`).
  virtual bool complete() const = 0;
  // The bytes, u8 on the host or on the backend's device, valid while the landing lives. Called once the
  // prefill side said `done` and complete() holds: the write is over, so a backend may reuse the memory
  // of such a landing for a later transfer (never that of one dropped before).
  virtual TensorView bytes() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Decode side: reserves `bytes` of landing memory. `host` is this process's address as the prefill
  // side reaches it (the local address of the control connection).
  virtual std::unique_ptr<Landing> land(size_t bytes, const std::string& host) = 0;
  // Prefill side: writes `segments` (whose sizes add up to the landing's) to the landing named by
  // `descriptor`, then calls done("") or done(why it failed) on the io thread. The segments stay valid
  // until done is called. The returned function cancels the write (done is then called with an error).
  virtual std::function<void()> send(const std::string& descriptor, std::vector<Segment> segments,
                                     std::function<void(std::string)> done) = 0;
  // Bytes of landing memory held now.
  virtual size_t landed_bytes() const = 0;
  // Whether send() takes segments in device memory (cuda-ipc, nccl) or only host memory (tcp).
  virtual bool reads_device_memory() const { return false; }
};

}  // namespace tern::transfer
