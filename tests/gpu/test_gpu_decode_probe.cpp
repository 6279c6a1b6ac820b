// The FP4 decode probe's e4m3 variants (kernels/fp4_decode_probe.cu) compute real products: the pieces a
// future e4m3 wgmma MoE decode kernel is built from (the m64n8k32 A fragment from registers, the no-swizzle
// K-major x descriptor, the prmt decodes of the natural and the moved-sign layouts, the per-32-column scales
// on fresh sums, x's scale per token) held to a host product on fresh random codes, scales and e4m3
// activations at V4-Flash's K = 4096.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/read_probe.cuh"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace tern {
namespace {

constexpr int kItems = 12, kRows = 64, kK = 4096, kTok = 8, kWinCols = 1024, kStages = 4;
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float e2m1(int code) {
  return (code & 8 ? -1.0f : 1.0f) * kE2m1[code & 7];
}

// One word of 8 codes (column n in nibble n) as the kernel reads it: natural, or with the signs moved
// (columns 0-3 at bits 7/15/23/31, columns 4-7 at 3/11/19/27, the magnitudes where they were).
uint32_t word_of(const int* c, bool moved) {
  uint32_t w = 0;
  for (int n = 0; n < 8; ++n) w |= static_cast<uint32_t>(moved ? c[n] & 7 : c[n]) << (4 * n);
  if (moved)
    for (int k = 0; k < 4; ++k) {
      w |= static_cast<uint32_t>(c[k] >> 3) << (8 * k + 7);
      w |= static_cast<uint32_t>(c[4 + k] >> 3) << (8 * k + 3);
    }
  return w;
}

// The physical column (0..31 of a 32-column block) that wgmma's k = j reads: thread t's word holds columns
// 8t .. 8t + 7, its A registers k 4t .. 4t + 3 (columns 8t .. 8t + 3) and 16 + 4t .. (8t + 4 .. 8t + 7).
int physical(int j) {
  return j < 16 ? 8 * (j / 4) + j % 4 : 8 * ((j - 16) / 4) + 4 + (j - 16) % 4;
}

TEST(GpuDecodeProbe, E4m3SumsMatchTheHost) {
  TERN_REQUIRE_GPU();
  std::mt19937 rng(20261205);
  std::vector<int> codes(static_cast<size_t>(kItems) * kRows * kK);
  for (int& c : codes) c = static_cast<int>(rng() % 16);
  std::vector<uint8_t> scales(static_cast<size_t>(kItems) * kRows * (kK / 32));
  for (uint8_t& s : scales) s = static_cast<uint8_t>(118 + rng() % 14);  // 2^-9 .. 2^4
  std::vector<uint8_t> x(static_cast<size_t>(kTok) * kWinCols);
  for (uint8_t& b : x)
    b = static_cast<uint8_t>((rng() % 2) << 7 | (4 + rng() % 6) << 3 | rng() % 8);  // finite e4m3

  // The window in the B layout: k32 block kb at kb * 256, its k 0-15 and 16-31 as two 8-token x 16-byte core
  // matrices 128 bytes apart.
  std::vector<uint8_t> window(16 * 1024, 0);
  for (int kb = 0; kb < kWinCols / 32; ++kb)
    for (int j = 0; j < 32; ++j)
      for (int n = 0; n < kTok; ++n)
        window[kb * 256 + (j / 16) * 128 + n * 16 + j % 16] = x[n * kWinCols + kb * 32 + physical(j)];

  // Host sums: x repeats every 1 024 columns; token n's sums times 1 (even n) or 0.5 (odd).
  std::vector<double> ref(static_cast<size_t>(kItems) * kRows * kTok), mag(ref.size());
  for (int i = 0; i < kItems; ++i)
    for (int r = 0; r < kRows; ++r)
      for (int n = 0; n < kTok; ++n) {
        double sum = 0, abs = 0;
        for (int c = 0; c < kK; ++c) {
          const size_t row = static_cast<size_t>(i) * kRows + r;
          const double term = e2m1(codes[row * kK + c]) *
                              std::ldexp(1.0, scales[row * (kK / 32) + c / 32] - 127) *
                              e4m3_to_f32(x[n * kWinCols + c % kWinCols]);
          sum += term, abs += std::fabs(term);
        }
        ref[(static_cast<size_t>(i) * kRows + r) * kTok + n] = sum * (n % 2 ? 0.5 : 1.0);
        mag[(static_cast<size_t>(i) * kRows + r) * kTok + n] = abs;
      }

  const int64_t item_bytes = cuda::fp4_decode_probe_item_bytes();
  cuda::DeviceBuffer xd(window.size()), out(ref.size() * sizeof(float)), sink(64), buf(kItems * item_bytes);
  ASSERT_EQ(cudaMemcpy(xd.data(), window.data(), window.size(), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::prepare_fp4_decode_probe();
  for (const bool moved : {false, true}) {
    // Items: 64 rows of 2 KB (K = 4096), then every item's stage scales ([item][stage][row][32]).
    std::vector<uint8_t> bytes(static_cast<size_t>(kItems * item_bytes), 0);
    const size_t fp4_bytes = static_cast<size_t>(kItems) * kRows * kK / 2;
    for (size_t row = 0; row < static_cast<size_t>(kItems) * kRows; ++row)
      for (int c = 0; c < kK; c += 8) {
        const uint32_t w = word_of(&codes[row * kK + c], moved);
        std::memcpy(&bytes[row * (kK / 2) + c / 2], &w, 4);
      }
    for (int i = 0; i < kItems; ++i)
      for (int q = 0; q < kStages; ++q)
        for (int r = 0; r < kRows; ++r)
          for (int kb = 0; kb < 32; ++kb)
            bytes[fp4_bytes + ((static_cast<size_t>(i) * kStages + q) * kRows + r) * 32 + kb] =
                scales[(static_cast<size_t>(i) * kRows + r) * (kK / 32) + q * 32 + kb];
    ASSERT_EQ(cudaMemcpy(buf.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    // (warpgroups, slots in all, blocks): 2 blocks of 2 warpgroups with 2 slots each (3 items a warpgroup, so
    // each ring wraps 6 times), and of 3 warpgroups (2 items each).
    for (const auto& [consumers, stages, grid] : {std::tuple{2, 4, 2}, std::tuple{3, 6, 2}}) {
      ASSERT_EQ(cudaMemset(out.data(), 0xff, out.size()), cudaSuccess);  // NaN: every sum must be written
      const auto stream = static_cast<cudaStream_t>(cuda::register_backend().stream());
      cuda::launch_fp4_decode_probe(moved ? 3 : 2, consumers, static_cast<const uint8_t*>(buf.data()), kItems,
                                    stages, grid, static_cast<uint32_t*>(sink.data()), stream,
                                    static_cast<const uint32_t*>(xd.data()), static_cast<float*>(out.data()));
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<float> got(ref.size());
      ASSERT_EQ(cudaMemcpy(got.data(), out.data(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      double err = 0, norm = 0, worst = 0;
      for (size_t e = 0; e < ref.size(); ++e) {
        ASSERT_TRUE(std::isfinite(got[e])) << (moved ? "moved" : "natural") << " sum " << e << " not written";
        err += (got[e] - ref[e]) * (got[e] - ref[e]), norm += ref[e] * ref[e];
        worst = std::max(worst, std::fabs(got[e] - ref[e]) / mag[e]);
      }
      // Products of e4m3 and e2m1 are exact; the tensor cores keep ~14 bits of each 32-column sum.
      EXPECT_LT(std::sqrt(err / norm), 1e-3)
          << (moved ? "moved signs" : "natural layout") << ", " << consumers << " warpgroups";
      EXPECT_LT(worst, 1e-3) << (moved ? "moved signs" : "natural layout")
                             << ": worst error over sum |terms|";
    }
  }
}

}  // namespace
}  // namespace tern
