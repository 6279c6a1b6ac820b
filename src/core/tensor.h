// Tensor views: a pointer with dtype, shape and strides (in elements), on a device. A view never
// owns memory; `Tensor` owns a host buffer and hands out views.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tern {

enum class Device : uint8_t { cpu, cuda };

constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::vector<int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string str() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

class TensorView {
 public:
  TensorView() = default;
  // Contiguous (row-major) view.
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::cpu);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t stride(int i) const { return strides_[i < 0 ? i + rank() : i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const;  // of the contiguous extent
  Device device() const { return device_; }
  bool is_contiguous() const;
  bool empty() const { return data_ == nullptr; }

  // Sub-view of rows [begin, end) along dimension 0.
  TensorView rows(int64_t begin, int64_t end) const;
  // Sub-view of columns [begin, end) of a rank-2 view: its rows stay where they were, so the result is
  // strided (one product's output split between its consumers: model/stacked.h).
  TensorView cols(int64_t begin, int64_t end) const;
  // For a view whose rows (every dimension but the last, flattened) each hold contiguous elements at one
  // distance from each other: that distance in elements (dim(-1) when contiguous, stride(0) for a cols()
  // view); -1 for any other layout. Ops that take "rows" accept exactly these views.
  int64_t row_stride() const;
  // Same bytes, another shape with the same number of elements (contiguous views only).
  TensorView reshape(Shape shape) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
  std::array<int64_t, kMaxDims> strides_{};
  Device device_ = Device::cpu;
};

// Memory of a non-host device. Core knows no device API: Tensors on a device and copies go through this. A
// backend may own several (the CUDA backend: its pool, and its step memory, which takes a recorded step's tensors
// from the step graphs' arena: CudaBackend::step_memory), handed out explicitly through its context
// (ops::Context::tensor) or used by the backend itself; one is installed as the device's registered memory.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Bytes on the device (ordered after the work already issued there), zero-filled when `zero`; otherwise
  // whatever the device's memory holds (a backend may fill them with a diagnostic pattern).
  virtual void* allocate(size_t bytes, bool zero) = 0;
  virtual void release(void* p) = 0;
  // Copies between the host and this device or within this device, ordered after the work issued on the
  // device; a copy to the host returns when the bytes are there, one from the host when its source may be
  // reused.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  virtual void fill(void* p, uint8_t byte, size_t bytes) = 0;
  // Returns when every copy and fill issued so far (device to device ones too) is done.
  virtual void synchronize() = 0;
};
// Installs (or, with nullptr, removes) the registered memory of `device` (not Device::cpu): what a device Tensor
// made without a memory (Tensor(dtype, shape, device): states, uploads, tests) and every copy_view use. The CUDA
// backend installs its pool (cuda::register_backend()), which refuses to allocate while a step is being recorded:
// a recorded step's tensors come from its context's memory instead.
void set_device_memory(Device device, DeviceMemory* memory);
// Throws naming the device when no backend installed one.
DeviceMemory& device_memory(Device device);

// Copies src into dst (same dtype-independent byte count, both contiguous), across devices as needed.
void copy_view(const TensorView& src, const TensorView& dst);

// Whether a new tensor's bytes are zeros (the default) or left as the memory holds them: activations that an op
// overwrites whole need no fill (on the GPU the fill was 45 ms of an 8K prefill).
enum class TensorInit { zeros, uninitialized };

// A tensor that owns its (64-byte aligned) buffer, on the host unless a device is given; zero-initialised
// unless TensorInit::uninitialized is asked for on a device (host tensors are always zeroed).
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);
  Tensor(DType dtype, Shape shape, Device device, TensorInit init = TensorInit::zeros);
  // The same from `memory` (a device's, not the one registered for it: an explicit allocator).
  Tensor(DType dtype, Shape shape, Device device, DeviceMemory& memory, TensorInit init = TensorInit::zeros);
  // A new tensor on `device` holding a copy of `src` (from any device).
  static Tensor copy_of(const TensorView& src, Device device);
  static Tensor zeros(DType dtype, Shape shape) { return Tensor(dtype, shape); }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }
  template <typename T>
  T* data() const {
    return view_.data_as<T>();
  }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t dim(int i) const { return view_.dim(i); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  bool empty() const { return view_.empty(); }
  Device device() const { return view_.device(); }

 private:
  std::shared_ptr<std::byte[]> buffer_;
  TensorView view_;
};

// Bytes needed for `numel` elements of `dtype` (rounded up for sub-byte types).
size_t dtype_bytes(DType dtype, int64_t numel);

}  // namespace tern
