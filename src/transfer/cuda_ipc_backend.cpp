#include "transfer/cuda_ipc_backend.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/error.h"

namespace tern::transfer {

namespace net = boost::asio;

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

std::string hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

void unhex(const std::string& s, void* out, size_t n) {
  TERN_CHECK(s.size() == 2 * n, "cuda-ipc transfer: malformed handle in the descriptor");
  auto v = [](char c) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    TERN_CHECK(d >= 0, "cuda-ipc transfer: malformed handle in the descriptor");
    return d;
  };
  for (size_t i = 0; i < n; ++i) static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(v(s[2 * i]) << 4 | v(s[2 * i + 1]));
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
  unhex(parts[3], &d.handle, sizeof d.handle);
  return d;
}

class IpcLanding : public Landing {
 public:
  IpcLanding(int device, size_t bytes, size_t* counter) : device_(device), bytes_(bytes), counter_(counter) {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMalloc(&ptr_, bytes), "cudaMalloc of the landing");
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, ptr_);
    if (e != cudaSuccess) {
      cudaFree(ptr_);
      check(e, "cudaIpcGetMemHandle");
    }
    descriptor_ = cat("cuda-ipc://", boot_id(), "/", getpid(), "/", device, "/", hex(&h, sizeof h), "/", bytes);
    *counter_ += bytes;
  }
  ~IpcLanding() override {
    cudaSetDevice(device_);
    cudaFree(ptr_);
    *counter_ -= bytes_;
  }
  std::string descriptor() const override { return descriptor_; }
  size_t size() const override { return bytes_; }
  // Nothing observes a peer's write into this memory: the control channel's `done` is the signal.
  bool complete() const override { return true; }
  std::vector<std::byte> take() override {
    std::vector<std::byte> out(bytes_);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "copying the landing to the host");
    return out;
  }
  void* device_pointer() const { return ptr_; }

 private:
  int device_;
  size_t bytes_;
  size_t* counter_;
  void* ptr_ = nullptr;
  std::string descriptor_;
};

class CudaIpcBackend : public Backend {
 public:
  CudaIpcBackend(net::io_context& io, CudaIpcOptions o) : io_(io), options_(o), boot_(boot_id()) {
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    TERN_CHECK(o.device >= 0 && o.device < n, "cuda-ipc transfer: device ", o.device, " does not exist (", n, " devices)");
  }
  std::string name() const override { return "cuda-ipc"; }

  std::unique_ptr<Landing> land(size_t bytes, const std::string&) override {
    return std::make_unique<IpcLanding>(options_.device, bytes, &landed_);
  }

  // The copy runs on a worker thread (it blocks until done); completion is posted to the io thread.
  std::function<void()> send(const std::string& descriptor, std::vector<Segment> segments,
                             std::function<void(std::string)> done) override {
    auto cancelled = std::make_shared<std::atomic<bool>>(false);
    std::thread([&io = io_, device = options_.device, boot = boot_, descriptor, segments = std::move(segments),
                 done = std::move(done), cancelled]() mutable {
      std::string error;
      try {
        write(device, boot, descriptor, segments);
      } catch (const std::exception& e) {
        error = e.what();
      }
      net::post(io, [done = std::move(done), error, cancelled] { done(*cancelled ? "cuda-ipc transfer: cancelled" : error); });
    }).detach();
    return [cancelled] { *cancelled = true; };
  }

  size_t landed_bytes() const override { return landed_; }

 private:
  static void write(int device, const std::string& boot, const std::string& descriptor, const std::vector<Segment>& segments) {
    const Descriptor d = parse(descriptor);
    TERN_CHECK(d.boot == boot, "cuda-ipc transfer: the decode process runs on another host (use the nccl or tcp backend)");
    size_t total = 0;
    for (const auto& s : segments) total += s.size();
    TERN_CHECK(total == d.bytes, "cuda-ipc transfer: ", total, " bytes to send, the landing holds ", d.bytes);
    check(cudaSetDevice(device), "cudaSetDevice");
    void* base = nullptr;
    check(cudaIpcOpenMemHandle(&base, d.handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    cudaError_t e = cudaSuccess;
    size_t at = 0;
    for (const auto& s : segments) {
      if (e == cudaSuccess) e = cudaMemcpy(static_cast<char*>(base) + at, s.data(), s.size(), cudaMemcpyDefault);
      at += s.size();
    }
    const cudaError_t closed = cudaIpcCloseMemHandle(base);
    check(e, "cudaMemcpy into the landing");
    check(closed, "cudaIpcCloseMemHandle");
  }

  net::io_context& io_;
  CudaIpcOptions options_;
  std::string boot_;
  size_t landed_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_ipc_backend(net::io_context& io, CudaIpcOptions options) {
  return std::make_unique<CudaIpcBackend>(io, options);
}

void* landing_device_pointer(Landing& landing) {
  auto* l = dynamic_cast<IpcLanding*>(&landing);
  return l ? l->device_pointer() : nullptr;
}

}  // namespace tern::transfer
