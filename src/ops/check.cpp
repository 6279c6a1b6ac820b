#include "ops/check.h"

#include <string>

namespace tern::ops::detail {

void expect_dtype(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : "|") + std::string(dtype_name(d));
  fail(op, ": ", arg, " must be ", names, ", found ", dtype_name(t.dtype()));
}

void expect_rank(std::string_view op, std::string_view arg, const TensorView& t, int rank) {
  TERN_CHECK(t.rank() == rank, op, ": ", arg, " must have rank ", rank, ", found shape ", t.shape().str());
}

void expect_shape(std::string_view op, std::string_view arg, const TensorView& t,
                  std::initializer_list<int64_t> dims) {
  bool ok = t.rank() == static_cast<int>(dims.size());
  int i = 0;
  std::string want = "[";
  for (int64_t d : dims) {
    want += (i ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
    if (ok && d >= 0 && t.dim(i) != d) ok = false;
    ++i;
  }
  want += "]";
  TERN_CHECK(ok, op, ": ", arg, " must have shape ", want, ", found ", t.shape().str());
  expect_contiguous(op, arg, t);
}

void expect_contiguous(std::string_view op, std::string_view arg, const TensorView& t) {
  TERN_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous");
}

Device common_device(std::string_view op, std::initializer_list<const TensorView*> views) {
  bool found = false;
  Device dev = Device::cpu;
  for (const TensorView* v : views) {
    if (v->empty()) continue;
    if (!found) {
      dev = v->device();
      found = true;
    }
    TERN_CHECK(v->device() == dev, op, ": tensors on different devices");
  }
  return dev;
}

}  // namespace tern::ops::detail
