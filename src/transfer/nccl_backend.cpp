#include "transfer/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/hex.h"

namespace tern::transfer {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// libnccl is loaded at run time, so that binaries with this backend start where NCCL is not installed
// (the backend then refuses to be made, saying why).
struct Nccl {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  std::string error;
};

const Nccl& nccl() {
  static const Nccl n = [] {
    Nccl n;
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.error = cat("cannot load libnccl.so.2 (", dlerror(), ")");
      return n;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && n.error.empty()) n.error = cat("libnccl.so.2 has no ", name, " (NCCL older than 2.14?)");
    };
    sym(n.get_unique_id, "ncclGetUniqueId");
    sym(n.init_rank_config, "ncclCommInitRankConfig");
    sym(n.get_async_error, "ncclCommGetAsyncError");
    sym(n.destroy, "ncclCommDestroy");
    sym(n.abort, "ncclCommAbort");
    sym(n.send, "ncclSend");
    sym(n.recv, "ncclRecv");
    sym(n.error_string, "ncclGetErrorString");
    return n;
  }();
  return n;
}

void check(cudaError_t e, const char* what) {
  TERN_CHECK(e == cudaSuccess, "nccl transfer: ", what, ": ", cudaGetErrorString(e));
}

void check(ncclResult_t r, const char* what) {
  TERN_CHECK(r == ncclSuccess || r == ncclInProgress, "nccl transfer: ", what, ": ", nccl().error_string(r));
}

// "nccl://<unique id hex>/<bytes>"
void parse(const std::string& s, ncclUniqueId& id, size_t& bytes) {
  const std::string bad = cat("nccl transfer: malformed descriptor \"", s.substr(0, 60), "\"");
  TERN_CHECK(s.rfind("nccl://", 0) == 0, bad);
  const size_t slash = s.find('/', 7);
  TERN_CHECK(slash == 7 + 2 * sizeof(ncclUniqueId), bad);
  TERN_CHECK(from_hex(std::string_view(s).substr(7, 2 * sizeof id), id.internal, sizeof id), bad);
  try {
    bytes = std::stoull(s.substr(slash + 1));
  } catch (const std::logic_error&) {
    throw Error(bad);
  }
}

// Joins a two-rank communicator, runs `op` on it and waits for it, polling so that `cancelled` or the
// deadline abort the communicator instead of blocking forever.
void run_p2p(const ncclUniqueId& id, int rank, int device, Clock::time_point deadline, const std::atomic<bool>& cancelled,
             const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& op) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  std::string error;
  auto wait_comm = [&](const char* what) {
    for (;;) {
      ncclResult_t state;
      check(nccl().get_async_error(comm, &state), what);
      if (state == ncclSuccess) return;
      TERN_CHECK(state == ncclInProgress, "nccl transfer: ", what, ": ", nccl().error_string(state));
      TERN_CHECK(!cancelled, "nccl transfer: cancelled");
      TERN_CHECK(Clock::now() < deadline, "nccl transfer: ", what, " timed out");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  try {
    check(nccl().init_rank_config(&comm, 2, id, rank, &config), "ncclCommInitRankConfig");
    wait_comm("joining the communicator");
    check(op(comm, stream), rank == 0 ? "ncclSend" : "ncclRecv");
    wait_comm("posting the transfer");
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) break;
      TERN_CHECK(q == cudaErrorNotReady, "nccl transfer: ", cudaGetErrorString(q));
      ncclResult_t state;
      check(nccl().get_async_error(comm, &state), "transfer");
      TERN_CHECK(!cancelled, "nccl transfer: cancelled");
      TERN_CHECK(Clock::now() < deadline, "nccl transfer: the peer did not complete in time");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  } catch (const Error& e) {
    error = e.what();
  }
  if (comm) {
    if (error.empty()) nccl().destroy(comm);
    else nccl().abort(comm);
  }
  cudaStreamDestroy(stream);
  TERN_CHECK(error.empty(), error);
}

struct LandingState {
  void* ptr = nullptr;
  size_t bytes = 0;
  std::atomic<bool> complete{false}, cancelled{false};
  std::string error;
};

class NcclLanding : public Landing {
 public:
  NcclLanding(int device, size_t bytes, std::chrono::milliseconds timeout, size_t* counter)
      : state_(std::make_shared<LandingState>()), device_(device), counter_(counter) {
    check(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id;
    check(nccl().get_unique_id(&id), "ncclGetUniqueId");
    check(cudaMalloc(&state_->ptr, bytes), "cudaMalloc of the landing");
    state_->bytes = bytes;
    descriptor_ = cat("nccl://", to_hex(&id, sizeof id), "/", bytes);
    *counter_ += bytes;
    // The receive waits for the peer on its own thread; it owns the memory until it ends.
    worker_ = std::thread([s = state_, id, device, deadline = Clock::now() + timeout] {
      try {
        run_p2p(id, 1, device, deadline, s->cancelled, [&](ncclComm_t comm, cudaStream_t stream) {
          return nccl().recv(s->ptr, s->bytes, ncclUint8, 0, comm, stream);
        });
        s->complete = true;
      } catch (const std::exception& e) {
        s->error = e.what();
      }
    });
  }
  ~NcclLanding() override {
    state_->cancelled = true;
    worker_.join();
    cudaSetDevice(device_);
    cudaFree(state_->ptr);
    *counter_ -= state_->bytes;
  }
  std::string descriptor() const override { return descriptor_; }
  size_t size() const override { return state_->bytes; }
  bool complete() const override { return state_->complete; }
  TensorView bytes() override {
    TERN_CHECK(state_->complete, "nccl transfer: the state has not arrived", state_->error.empty() ? "" : ": ", state_->error);
    return TensorView(state_->ptr, DType::u8, {static_cast<int64_t>(state_->bytes)}, Device::cuda);
  }

 private:
  std::shared_ptr<LandingState> state_;
  int device_;
  size_t* counter_;
  std::string descriptor_;
  std::thread worker_;
};

class NcclBackend : public Backend {
 public:
  NcclBackend(asio::io_context& io, NcclOptions o) : io_(io), options_(o) {
    TERN_CHECK(nccl().error.empty(), "nccl transfer: ", nccl().error);
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    TERN_CHECK(o.device >= 0 && o.device < n, "nccl transfer: device ", o.device, " does not exist (", n, " devices)");
  }
  std::string name() const override { return "nccl"; }
  std::unique_ptr<Landing> land(size_t bytes, const std::string&) override {
    return std::make_unique<NcclLanding>(options_.device, bytes, options_.timeout, &landed_);
  }
  std::function<void()> send(const std::string& descriptor, std::vector<Segment> segments,
                             std::function<void(std::string)> done) override {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    std::thread([&io = io_, o = options_, descriptor, segments = std::move(segments), done = std::move(done), cancelled]() mutable {
      std::string error;
      void* staging = nullptr;
      try {
        ncclUniqueId id;
        size_t bytes = 0;
        parse(descriptor, id, bytes);
        size_t total = 0;
        for (const auto& s : segments) total += s.size();
        TERN_CHECK(total == bytes, "nccl transfer: ", total, " bytes to send, the landing holds ", bytes);
        check(cudaSetDevice(o.device), "cudaSetDevice");
        // NCCL sends device memory: one device segment (a handover kept on the GPU) goes as it is; host
        // segments or several are gathered into one buffer first.
        const void* from = nullptr;
        cudaPointerAttributes where{};
        if (segments.size() == 1 && cudaPointerGetAttributes(&where, segments[0].data()) == cudaSuccess &&
            where.type == cudaMemoryTypeDevice)
          from = segments[0].data();
        cudaGetLastError();  // a host pointer may leave an error behind on older drivers
        if (from == nullptr) {
          check(cudaMalloc(&staging, bytes), "cudaMalloc of the staging buffer");
          size_t at = 0;
          for (const auto& s : segments) {
            check(cudaMemcpy(static_cast<char*>(staging) + at, s.data(), s.size(), cudaMemcpyDefault), "staging a segment");
            at += s.size();
          }
          from = staging;
        }
        run_p2p(id, 0, o.device, Clock::now() + o.timeout, *cancelled, [&](ncclComm_t comm, cudaStream_t stream) {
          return nccl().send(from, bytes, ncclUint8, 1, comm, stream);
        });
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (staging) cudaFree(staging);
      asio::post(io, [done = std::move(done), error] { done(error); });
    }).detach();
    return [cancelled] { *cancelled = true; };
  }
  size_t landed_bytes() const override { return landed_; }
  bool reads_device_memory() const override { return true; }

 private:
  asio::io_context& io_;
  NcclOptions options_;
  size_t landed_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(asio::io_context& io, NcclOptions options) {
  return std::make_unique<NcclBackend>(io, options);
}

}  // namespace tern::transfer
