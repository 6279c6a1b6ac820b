#include "backends/cuda/device_memory.h"

#include <utility>

#include "backends/cuda/cuda_check.h"

namespace tern::cuda {

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    return false;
  }
  return n > 0;
}

std::string device_description() {
  if (!device_available()) return "no CUDA device";
  int dev = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  TERN_CUDA(cudaGetDeviceProperties(&p, dev));
  size_t free_b = 0, total_b = 0;
  TERN_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return cat(p.name, ", sm_", p.major, p.minor, ", ", p.multiProcessorCount, " SMs, ",
             static_cast<double>(total_b) / (1 << 30), " GiB (", static_cast<double>(free_b) / (1 << 30), " free)");
}

DeviceMemoryInfo device_memory_info() {
  size_t free_b = 0, total_b = 0;
  TERN_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return {static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

DeviceBuffer::DeviceBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&data_, bytes);
  if (e != cudaSuccess) {
    data_ = nullptr;
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail("cudaMalloc of ", bytes, " bytes failed (", cudaGetErrorString(e), "); the device has ", free_b,
         " of ", total_b, " bytes free");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) {
    cudaDeviceSynchronize();
    cudaFree(data_);
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

DeviceTensor::DeviceTensor(DType dtype, Shape shape)
    : buffer_(dtype_bytes(dtype, shape.numel())), view_(buffer_.data(), dtype, shape, Device::cuda) {}

DeviceTensor to_device(const TensorView& host) {
  TERN_CHECK(host.device() == Device::cpu && host.is_contiguous(), "to_device: need a contiguous host view");
  DeviceTensor d(host.dtype(), host.shape());
  copy_to_device(host, d.view());
  return d;
}

void copy_to_device(const TensorView& host, const TensorView& dev) {
  TERN_CHECK(host.nbytes() == dev.nbytes() && dev.device() == Device::cuda, "copy_to_device: ", host.shape().str(),
             " vs ", dev.shape().str());
  if (host.nbytes() == 0) return;
  TERN_CUDA(cudaMemcpy(dev.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice));
}

void copy_to_host(const TensorView& dev, const TensorView& host) {
  TERN_CHECK(host.nbytes() == dev.nbytes() && dev.device() == Device::cuda && host.device() == Device::cpu,
             "copy_to_host: ", dev.shape().str(), " vs ", host.shape().str());
  if (host.nbytes() == 0) return;
  TERN_CUDA(cudaMemcpy(host.data(), dev.data(), host.nbytes(), cudaMemcpyDeviceToHost));
}

Tensor to_host(const TensorView& dev) {
  Tensor t(dev.dtype(), dev.shape());
  copy_to_host(dev, t.view());
  return t;
}

void fill_bytes(const TensorView& dev, uint8_t byte) {
  if (dev.nbytes() == 0) return;
  TERN_CUDA(cudaMemset(dev.data(), byte, dev.nbytes()));
}

TensorView WeightStore::upload(const TensorView& host) {
  if (host.empty()) return {};
  TERN_CHECK(host.is_contiguous(), "WeightStore::upload: non-contiguous view");
  DeviceBuffer buf(host.nbytes());
  TERN_CUDA(cudaMemcpy(buf.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice));
  TensorView v(buf.data(), host.dtype(), host.shape(), Device::cuda);
  bytes_ += buf.size();
  buffers_.push_back(std::move(buf));
  return v;
}

ops::Weight WeightStore::upload(const ops::Weight& host) {
  ops::Weight d = host;
  d.weight = upload(host.weight);
  d.scale = upload(host.scale);
  return d;
}

}  // namespace tern::cuda
