// The small ops the GPU op tests compare against the CPU (tests/gpu/test_gpu_basic.cpp, GpuBasic.Elementwise)
// held to their definitions here: embedding, add, gather_rows, hc_expand. Before these tests the four were
// checked on the CPU only through the whole model's parity with the PyTorch fixtures (issue #17: "every GPU op
// has a CPU test").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/mhc.h"
#include "test_util.h"

namespace tern {
namespace {

Tensor ids_tensor(std::initializer_list<int64_t> v) {
  Tensor t(DType::i64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

TEST(Elementwise, EmbeddingCopiesTheRowOfEachIdFromF32AndBf16Tables) {
  test::Random rng(71);
  const int64_t vocab = 11, D = 9;
  Tensor f32_table = rng.tensor({vocab, D});
  Tensor bf16_table(DType::bf16, {vocab, D});
  for (int64_t i = 0; i < vocab * D; ++i) bf16_table.data<uint16_t>()[i] = f32_to_bf16(f32_table.data<float>()[i]);
  Tensor ids = ids_tensor({3, 0, 10, 3, 7});  // a repeat, both ends of the vocabulary
  const int64_t T = ids.dim(0);
  Tensor out(DType::f32, {T, D}), out16(DType::f32, {T, D});
  ops::embedding(cpu::context(), f32_table, ids, out);
  ops::embedding(cpu::context(), bf16_table, ids, out16);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids.data<int64_t>()[t];
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(out.data<float>()[t * D + d], f32_table.data<float>()[id * D + d]);
      EXPECT_EQ(out16.data<float>()[t * D + d], bf16_to_f32(bf16_table.data<uint16_t>()[id * D + d]));
    }
  }
  // An id outside the vocabulary is refused by name, never read past the table.
  Tensor bad = ids_tensor({2, vocab});
  Tensor out_bad(DType::f32, {2, D});
  EXPECT_THROW(ops::embedding(cpu::context(), f32_table, bad, out_bad), Error);
  Tensor negative = ids_tensor({-1});
  Tensor out_one(DType::f32, {1, D});
  EXPECT_THROW(ops::embedding(cpu::context(), f32_table, negative, out_one), Error);
  // The shapes are checked before the backend runs.
  Tensor wrong(DType::f32, {T, D + 1});
  EXPECT_THROW(ops::embedding(cpu::context(), f32_table, ids, wrong), Error);
}

TEST(Elementwise, AddAccumulatesIntoY) {
  test::Random rng(72);
  Tensor x = rng.tensor({5, 7}), y = rng.tensor({5, 7});
  Tensor before = Tensor::copy_of(y, Device::cpu);
  ops::add(cpu::context(), x, y);
  for (int64_t i = 0; i < x.numel(); ++i)
    EXPECT_EQ(y.data<float>()[i], before.data<float>()[i] + x.data<float>()[i]);
  Tensor other(DType::f32, {5, 8});
  EXPECT_THROW(ops::add(cpu::context(), x, other), Error);
}

TEST(Elementwise, GatherRowsCopiesTheNamedRowsInOrder) {
  test::Random rng(73);
  const int64_t R = 6, D = 5;
  Tensor x = rng.tensor({R, D});
  Tensor rows = ids_tensor({5, 0, 0, 3});  // any order, repeats allowed
  Tensor out(DType::f32, {rows.dim(0), D});
  ops::gather_rows(cpu::context(), x, rows, out);
  for (int64_t i = 0; i < rows.dim(0); ++i)
    EXPECT_EQ(std::memcmp(out.data<float>() + i * D, x.data<float>() + rows.data<int64_t>()[i] * D, D * 4), 0)
        << "row " << i;
  Tensor bad = ids_tensor({R});
  Tensor out_one(DType::f32, {1, D});
  EXPECT_THROW(ops::gather_rows(cpu::context(), x, bad, out_one), Error);
}

TEST(Elementwise, HcExpandCopiesEachTokenIntoEveryStream) {
  test::Random rng(74);
  const int64_t T = 3, hc = 4, D = 6;
  Tensor x = rng.tensor({T, D});
  Tensor streams = rng.tensor({T, hc, D});  // overwritten whole
  ops::hc_expand(cpu::context(), x, streams);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hc; ++i)
      EXPECT_EQ(std::memcmp(streams.data<float>() + (t * hc + i) * D, x.data<float>() + t * D, D * 4), 0)
          << "token " << t << " stream " << i;
  Tensor wrong(DType::f32, {T, hc, D + 1});
  EXPECT_THROW(ops::hc_expand(cpu::context(), x, wrong), Error);
}

}  // namespace
}  // namespace tern
