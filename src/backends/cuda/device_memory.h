// Device memory for the CUDA backend, with no CUDA header in sight (tests and tools include this):
// owning buffers, tensors copied to and from the device, weights uploaded from the mapped checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/weight.h"

namespace tern::cuda {

// True when a CUDA device is present and the runtime answers (no exception, no abort).
bool device_available();
// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs, 79.1 GiB" (or why there is none).
std::string device_description();
// Free and total bytes of the current device (cudaMemGetInfo).
struct DeviceMemoryInfo {
  int64_t free_bytes = 0, total_bytes = 0;
};
DeviceMemoryInfo device_memory_info();

// cudaMalloc'd bytes, freed on destruction (synchronising the device first, so no kernel still uses them).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A device tensor that owns its buffer.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DType dtype, Shape shape);  // uninitialised
  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  int64_t numel() const { return view_.numel(); }

 private:
  DeviceBuffer buffer_;
  TensorView view_;
};

// Copies (synchronous).
DeviceTensor to_device(const TensorView& host);
void copy_to_device(const TensorView& host, const TensorView& dev);
void copy_to_host(const TensorView& dev, const TensorView& host);
Tensor to_host(const TensorView& dev);
// Sets every byte of the view (tests poison outputs with it).
void fill_bytes(const TensorView& dev, uint8_t byte);

// Owns the device copies of uploaded weights and counts their bytes (the startup memory plan).
class WeightStore {
 public:
  TensorView upload(const TensorView& host);
  ops::Weight upload(const ops::Weight& host);
  size_t bytes() const { return bytes_; }

 private:
  std::vector<DeviceBuffer> buffers_;
  size_t bytes_ = 0;
};

}  // namespace tern::cuda
