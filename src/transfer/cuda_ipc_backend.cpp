#include "transfer/cuda_ipc_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/hex.h"

namespace tern::transfer {

namespace asio = boost::asio;

namespace {

void check(cudaError_t e, const char* what) {
  TERN_CHECK(e == cudaSuccess, "cuda-ipc transfer: ", what, ": ", cudaGetErrorString(e));
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

// "cuda-ipc://<boot id>/<pid>/<device>/<handle hex>/<bytes>"
struct Descriptor {
  std::string boot;
  long pid = 0;
  int device = 0;
  cudaIpcMemHandle_t handle{};
  size_t bytes = 0;
};

Descriptor parse(const std::string& s) {
  const std::string bad = cat("cuda-ipc transfer: malformed descriptor \"", s.substr(0, 80), "\"");
  TERN_CHECK(s.rfind("cuda-ipc://", 0) == 0, bad);
  std::vector<std::string> parts;
  size_t at = 11;
  for (size_t slash; (slash = s.find('/', at)) != std::string::npos; at = slash + 1) parts.push_back(s.substr(at, slash - at));
  parts.push_back(s.substr(at));
  TERN_CHECK(parts.size() == 5, bad);
  Descriptor d;
  d.boot = parts[0];
  try {
    d.pid = std::stol(parts[1]);
    d.device = std::stoi(parts[2]);
    d.bytes = std::stoull(parts[4]);
  } catch (const std::logic_error&) {
    throw Error(bad);
  }
  TERN_CHECK(from_hex(parts[3], &d.handle, sizeof d.handle), "cuda-ipc transfer: malformed handle in the descriptor");
  return d;
}

// Device buffers exported once and reused by later landings: cudaMalloc / cudaFree (which waits for the
// whole device) and a fresh handle per transfer cost milliseconds; a reused buffer keeps its handle, which
// the prefill side keeps open (OpenHandles).
class LandingPool {
 public:
  struct Block {
    void* ptr = nullptr;
    size_t capacity = 0;
    std::string handle;  // hex of its cudaIpcMemHandle_t
  };
  static constexpr size_t kKeepFree = 4;          // idle blocks kept for reuse
  static constexpr size_t kRound = size_t{2} << 20;  // capacities in 2 MiB steps

  explicit LandingPool(int device) : device_(device) {}
  ~LandingPool() {
    cudaSetDevice(device_);
    for (auto& b : free_) cudaFree(b.ptr);
  }
  // The smallest idle block that holds `bytes`, or a new one.
  Block take(size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
      if (best != free_.end()) {
        Block b = *best;
        free_.erase(best);
        return b;
      }
    }
    Block b;
    b.capacity = (std::max<size_t>(bytes, 1) + kRound - 1) / kRound * kRound;
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMalloc(&b.ptr, b.capacity), "cudaMalloc of the landing");
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, b.ptr);
    if (e != cudaSuccess) {
      cudaFree(b.ptr);
      check(e, "cudaIpcGetMemHandle");
    }
    b.handle = to_hex(&h, sizeof h);
    return b;
  }
  // A block whose transfer did not finish: a late write from the prefill side could still land in it, so
  // it is never handed to another transfer.
  void discard(Block b) {
    cudaSetDevice(device_);
    cudaFree(b.ptr);
  }
  // Back for reuse; beyond kKeepFree idle blocks the oldest is freed.
  void give(Block b) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(b));
    if (free_.size() > kKeepFree) {
      cudaSetDevice(device_);
      cudaFree(free_.front().ptr);
      free_.erase(free_.begin());
    }
  }
  int device() const { return device_; }

 private:
  int device_;
  std::mutex mutex_;
  std::vector<Block> free_;
};

class IpcLanding : public Landing {
 public:
  IpcLanding(std::shared_ptr<LandingPool> pool, size_t bytes, std::atomic<size_t>* counter)
      : pool_(std::move(pool)), block_(pool_->take(bytes)), bytes_(bytes), counter_(counter) {
    descriptor_ = cat("cuda-ipc://", boot_id(), "/", getpid(), "/", pool_->device(), "/", block_.handle, "/", bytes);
    *counter_ += bytes;
  }
  ~IpcLanding() override {
    if (done_)
      pool_->give(std::move(block_));
    else
      pool_->discard(std::move(block_));
    *counter_ -= bytes_;
  }
  std::string descriptor() const override { return descriptor_; }
  size_t size() const override { return bytes_; }
  // Nothing observes a peer's write into this memory: the control channel's `done` is the signal.
  bool complete() const override { return true; }
  // Called once the prefill side said `done`: its write is over, and the block may serve again.
  TensorView bytes() override {
    done_ = true;
    return TensorView(block_.ptr, DType::u8, {static_cast<int64_t>(bytes_)}, Device::cuda);
  }

 private:
  std::shared_ptr<LandingPool> pool_;
  LandingPool::Block block_;
  size_t bytes_;
  std::atomic<size_t>* counter_;
  std::string descriptor_;
  bool done_ = false;
};

// The prefill side's opened handles, kept for the next transfer to the same landing block (the decode
// side reuses its blocks); the least recently used beyond kKeep is closed.
class OpenHandles {
 public:
  static constexpr size_t kKeep = 32;
  ~OpenHandles() {
    for (auto& e : open_) cudaIpcCloseMemHandle(e.base);
  }
  void* open(const cudaIpcMemHandle_t& handle) {
    const std::string key(reinterpret_cast<const char*>(&handle), sizeof handle);
    std::lock_guard lock(mutex_);
    for (auto it = open_.begin(); it != open_.end(); ++it)
      if (it->key == key) {
        std::rotate(open_.begin(), it, it + 1);  // most recent first
        return open_.front().base;
      }
    void* base = nullptr;
    check(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    open_.insert(open_.begin(), {key, base});
    if (open_.size() > kKeep) {
      cudaIpcCloseMemHandle(open_.back().base);
      open_.pop_back();
    }
    return base;
  }
  // A copy into it failed: the mapping may be stale (the decode process went away).
  void forget(void* base) {
    std::lock_guard lock(mutex_);
    for (auto it = open_.begin(); it != open_.end(); ++it)
      if (it->base == base) {
        cudaIpcCloseMemHandle(base);
        open_.erase(it);
        return;
      }
  }

 private:
  struct Entry {
    std::string key;
    void* base;
  };
  std::mutex mutex_;
  std::vector<Entry> open_;
};

class CudaIpcBackend : public Backend {
 public:
  CudaIpcBackend(asio::io_context& io, CudaIpcOptions o)
      : io_(io), options_(o), boot_(boot_id()), handles_(std::make_shared<OpenHandles>()) {
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    TERN_CHECK(o.device >= 0 && o.device < n, "cuda-ipc transfer: device ", o.device, " does not exist (", n, " devices)");
    pool_ = std::make_shared<LandingPool>(o.device);
  }
  std::string name() const override { return "cuda-ipc"; }

  std::unique_ptr<Landing> land(size_t bytes, const std::string&) override {
    return std::make_unique<IpcLanding>(pool_, bytes, &landed_);
  }

  // The copy runs on a worker thread (it waits for its own stream); completion is posted to the io thread.
  std::function<void()> send(const std::string& descriptor, std::vector<Segment> segments,
                             std::function<void(std::string)> done) override {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    std::thread([&io = io_, device = options_.device, boot = boot_, handles = handles_, descriptor,
                 segments = std::move(segments), done = std::move(done), cancelled]() mutable {
      std::string error;
      try {
        write(device, boot, *handles, descriptor, segments);
      } catch (const std::exception& e) {
        error = e.what();
      }
      asio::post(io, [done = std::move(done), error, cancelled] { done(*cancelled ? "cuda-ipc transfer: cancelled" : error); });
    }).detach();
    return [cancelled] { *cancelled = true; };
  }

  size_t landed_bytes() const override { return landed_; }
  bool reads_device_memory() const override { return true; }

 private:
  // On a stream of its own that does not wait for the default stream (the engine's work goes on).
  static void write(int device, const std::string& boot, OpenHandles& handles, const std::string& descriptor,
                    const std::vector<Segment>& segments) {
    const Descriptor d = parse(descriptor);
    TERN_CHECK(d.boot == boot, "cuda-ipc transfer: the decode process runs on another host (use the nccl or tcp backend)");
    size_t total = 0;
    for (const auto& s : segments) total += s.size();
    TERN_CHECK(total == d.bytes, "cuda-ipc transfer: ", total, " bytes to send, the landing holds ", d.bytes);
    check(cudaSetDevice(device), "cudaSetDevice");
    void* base = handles.open(d.handle);
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cudaError_t e = cudaSuccess;
    size_t at = 0;
    for (const auto& s : segments) {
      if (e == cudaSuccess) e = cudaMemcpyAsync(static_cast<char*>(base) + at, s.data(), s.size(), cudaMemcpyDefault, stream);
      at += s.size();
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    if (e != cudaSuccess) handles.forget(base);
    check(e, "cudaMemcpyAsync into the landing");
  }

  asio::io_context& io_;
  CudaIpcOptions options_;
  std::string boot_;
  std::shared_ptr<OpenHandles> handles_;
  std::shared_ptr<LandingPool> pool_;
  std::atomic<size_t> landed_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_ipc_backend(asio::io_context& io, CudaIpcOptions options) {
  return std::make_unique<CudaIpcBackend>(io, options);
}

}  // namespace tern::transfer
