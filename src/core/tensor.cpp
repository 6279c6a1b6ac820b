#include "core/tensor.h"

#include <array>
#include <cstring>
#include <new>

namespace tern {

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::vector<int64_t>(dims)) {}

Shape::Shape(const std::vector<int64_t>& dims) {
  TERN_CHECK(dims.size() <= kMaxDims, "tensor rank ", dims.size(), " exceeds the maximum of ", kMaxDims);
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) {
    TERN_CHECK(dims[i] >= 0, "negative dimension ", dims[i], " in shape");
    dims_[i] = dims[i];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

size_t dtype_bytes(DType dtype, int64_t numel) {
  return static_cast<size_t>((numel * dtype_bits(dtype) + 7) / 8);
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : data_(data), dtype_(dtype), shape_(shape), device_(device) {
  int64_t stride = 1;
  for (int i = shape_.rank() - 1; i >= 0; --i) {
    strides_[i] = stride;
    stride *= shape_[i];
  }
}

size_t TensorView::nbytes() const {
  return dtype_bytes(dtype_, numel());
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != stride) return false;
    stride *= shape_[i];
  }
  return true;
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  TERN_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "rows [", begin, ", ", end,
             ") out of range for shape ", shape_.str());
  TERN_CHECK(dtype_bits(dtype_) >= 8 || (begin * strides_[0] * dtype_bits(dtype_)) % 8 == 0,
             "row slice is not byte aligned");
  TensorView v = *this;
  v.data_ = static_cast<std::byte*>(data_) + dtype_bytes(dtype_, begin * strides_[0]);
  v.shape_[0] = end - begin;
  return v;
}

TensorView TensorView::cols(int64_t begin, int64_t end) const {
  TERN_CHECK(rank() == 2 && 0 <= begin && begin <= end && end <= dim(1), "cols [", begin, ", ", end,
             ") out of range for shape ", shape_.str(), " (a rank-2 view)");
  TERN_CHECK(dtype_bits(dtype_) >= 8, "column slice of a sub-byte dtype");
  TensorView v = *this;
  v.data_ = static_cast<std::byte*>(data_) + dtype_bytes(dtype_, begin * strides_[1]);
  v.shape_[1] = end - begin;
  return v;
}

int64_t TensorView::row_stride() const {
  if (rank() == 0) return -1;
  if (is_contiguous()) return dim(-1);
  if (rank() == 2 && (strides_[1] == 1 || shape_[1] == 1) && strides_[0] >= shape_[1]) return strides_[0];
  return -1;
}

TensorView TensorView::reshape(Shape shape) const {
  TERN_CHECK(is_contiguous(), "reshape of a non-contiguous view");
  TERN_CHECK(shape.numel() == numel(), "cannot reshape ", shape_.str(), " to ", shape.str());
  return TensorView(data_, dtype_, shape, device_);
}

namespace {
std::array<DeviceMemory*, 2> g_device_memory{};
}  // namespace

void set_device_memory(Device device, DeviceMemory* memory) {
  TERN_CHECK(device != Device::cpu, "set_device_memory: the host needs none");
  g_device_memory.at(static_cast<size_t>(device)) = memory;
}

DeviceMemory& device_memory(Device device) {
  DeviceMemory* m = g_device_memory.at(static_cast<size_t>(device));
  TERN_CHECK(m != nullptr, "no memory installed for device cuda: register its backend first");
  return *m;
}

void copy_view(const TensorView& src, const TensorView& dst) {
  TERN_CHECK(src.nbytes() == dst.nbytes() && src.is_contiguous() && dst.is_contiguous(),
             "copy: ", src.shape().str(), " (", src.nbytes(), " bytes) to ", dst.shape().str(), " (",
             dst.nbytes(), " bytes), both contiguous");
  if (src.nbytes() == 0) return;
  if (src.device() == Device::cpu && dst.device() == Device::cpu) {
    std::memmove(dst.data(), src.data(), src.nbytes());
    return;
  }
  const Device dev = src.device() == Device::cpu ? dst.device() : src.device();
  TERN_CHECK(src.device() == Device::cpu || dst.device() == Device::cpu || src.device() == dst.device(),
             "copy: between two different devices");
  device_memory(dev).copy(dst.data(), dst.device(), src.data(), src.device(), src.nbytes());
}

Tensor::Tensor(DType dtype, Shape shape, Device device, TensorInit init) {
  if (device == Device::cpu) {
    *this = Tensor(dtype, shape);
    return;
  }
  *this = Tensor(dtype, shape, device, device_memory(device), init);
}

Tensor::Tensor(DType dtype, Shape shape, Device device, DeviceMemory& mem, TensorInit init) {
  TERN_CHECK(device != Device::cpu, "a host tensor takes no device memory");
  const size_t bytes = dtype_bytes(dtype, shape.numel());
  const size_t padded = (bytes + 255) / 256 * 256;
  auto* raw = static_cast<std::byte*>(mem.allocate(padded == 0 ? 256 : padded, init == TensorInit::zeros));
  buffer_ = std::shared_ptr<std::byte[]>(raw, [&mem](std::byte* p) { mem.release(p); });
  view_ = TensorView(raw, dtype, shape, device);
}

Tensor Tensor::copy_of(const TensorView& src, Device device) {
  Tensor t(src.dtype(), src.shape(), device);
  copy_view(src, t.view());
  return t;
}

Tensor::Tensor(DType dtype, Shape shape) {
  const size_t bytes = dtype_bytes(dtype, shape.numel());
  const size_t padded = (bytes + 63) / 64 * 64;
  auto* raw = static_cast<std::byte*>(::operator new[](padded == 0 ? 64 : padded, std::align_val_t{64}));
  std::memset(raw, 0, padded == 0 ? 64 : padded);
  buffer_ =
      std::shared_ptr<std::byte[]>(raw, [](std::byte* p) { ::operator delete[](p, std::align_val_t{64}); });
  view_ = TensorView(raw, dtype, shape, Device::cpu);
}

}  // namespace tern
