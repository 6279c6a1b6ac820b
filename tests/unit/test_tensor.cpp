#include <gtest/gtest.h>

#include "core/tensor.h"

namespace tern {
namespace {

TEST(Tensor, ContiguousStridesAndRows) {
  Tensor t(DType::f32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.view().stride(0), 4);
  EXPECT_EQ(t.view().stride(1), 1);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  const TensorView r = t.view().rows(1, 3);
  EXPECT_EQ(r.shape(), Shape({2, 4}));
  EXPECT_EQ(r.data_as<float>()[0], 4.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data<float>()) % 64, 0u);
}

TEST(Tensor, BadSlicesAndReshapesThrow) {
  Tensor t(DType::bf16, {2, 3});
  EXPECT_THROW(t.view().rows(1, 3), Error);
  EXPECT_THROW(t.view().reshape({4, 2}), Error);
  EXPECT_EQ(t.view().reshape({3, 2}).shape(), Shape({3, 2}));
  EXPECT_THROW(Shape({1, 2, 3, 4, 5, 6, 7}), Error);
}

TEST(Tensor, SubByteSizes) {
  EXPECT_EQ(dtype_bytes(DType::e2m1, 5), 3u);
  Tensor t(DType::e2m1, {4, 8});
  EXPECT_EQ(t.nbytes(), 16u);
}

}  // namespace
}  // namespace tern
