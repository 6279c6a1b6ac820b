#include "core/tensor.h"

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

size_t TensorView::nbytes() const { return dtype_bytes(dtype_, numel()); }

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

TensorView TensorView::reshape(Shape shape) const {
  TERN_CHECK(is_contiguous(), "reshape of a non-contiguous view");
  TERN_CHECK(shape.numel() == numel(), "cannot reshape ", shape_.str(), " to ", shape.str());
  return TensorView(data_, dtype_, shape, device_);
}

Tensor::Tensor(DType dtype, Shape shape) {
  const size_t bytes = dtype_bytes(dtype, shape.numel());
  const size_t padded = (bytes + 63) / 64 * 64;
  auto* raw = static_cast<std::byte*>(::operator new[](padded == 0 ? 64 : padded, std::align_val_t{64}));
  std::memset(raw, 0, padded == 0 ? 64 : padded);
  buffer_ = std::shared_ptr<std::byte[]>(raw, [](std::byte* p) { ::operator delete[](p, std::align_val_t{64}); });
  view_ = TensorView(raw, dtype, shape, Device::cpu);
}

}  // namespace tern
