#include "app/pd_transfer.h"

#include "core/error.h"
#include "transfer/tcp_backend.h"
#if TERN_WITH_CUDA
#include "transfer/cuda_ipc_backend.h"
#if TERN_HAVE_NCCL
#include "transfer/nccl_backend.h"
#endif
#endif

namespace tern::app {

std::unique_ptr<transfer::Backend> make_pd_backend(const PdBackendChoice& c, const transfer::PdOptions& options,
                                                   boost::asio::io_context& io) {
  if (c.name == "tcp") {
    transfer::TcpBackendOptions t;
    t.bind_host = c.bind_host;
    t.port = c.port;
    t.listen = c.listen;
    t.connect_timeout = options.channel.connect_timeout;
    t.stall_timeout = options.channel.peer_timeout;
    return transfer::make_tcp_backend(io, t);
  }
  TERN_CHECK(c.name == "cuda-ipc" || c.name == "nccl", "--pd-backend: expected tcp, cuda-ipc or nccl, found \"", c.name,
             "\"");
  TERN_CHECK(c.device == "cuda", "--pd-backend ", c.name, " moves device memory: it needs --device cuda");
#if TERN_WITH_CUDA
  if (c.name == "cuda-ipc") return transfer::make_cuda_ipc_backend(io, {});
#if TERN_HAVE_NCCL
  transfer::NcclOptions n;
  n.timeout = options.transfer_timeout;
  return transfer::make_nccl_backend(io, n);
#else
  fail("--pd-backend nccl: this tern was built without NCCL (no nccl.h when it was configured)");
#endif
#else
  (void)options;
  (void)io;
  fail("--pd-backend ", c.name, ": this tern was built without the CUDA backend");
#endif
}

}  // namespace tern::app
