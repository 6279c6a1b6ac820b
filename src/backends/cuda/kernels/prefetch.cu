// Why: a decode step at small batches reads each weight once, and between the weight-bound products (norms,
// attention, routing, mHC) the DRAM idles. A prefetch issued a few kernels ahead of a product fetches its
// weights into L2 during those gaps, so the product itself reads them from L2.
#include <algorithm>

#include "backends/cuda/kernels/launch.cuh"
#include "backends/cuda/kernels/prefetch.cuh"

namespace tern::cuda {
namespace dev {
namespace {

constexpr int kPrefetchThreads = 128, kPrefetchBlocks = 8;
constexpr int64_t kPrefetchPiece = 64 * 1024;  // bytes per bulk prefetch instruction

struct Ranges {
  uintptr_t begin[kMaxPrefetchRanges];
  int64_t bytes[kMaxPrefetchRanges];  // multiples of 16
  int n;
};

// The ranges' pieces of kPrefetchPiece bytes numbered one after another; thread i prefetches pieces i,
// i + threads, ...: a few instructions a thread, earlier ranges first.
__global__ void __launch_bounds__(kPrefetchThreads) l2_prefetch_kernel(Ranges r) {
  // Work before the wait: only prefetches of weight bytes (no kernel writes weights while decode kernels run),
  // and the early launch of the next kernel (this one writes nothing it could read).
  grid_dependents_launch();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t first = 0;  // number of the range's first piece
  for (int k = 0; k < r.n; ++k) {
    const int64_t pieces = (r.bytes[k] + kPrefetchPiece - 1) / kPrefetchPiece;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x - first;
    i = i >= 0 ? i : i + (-i + stride - 1) / stride * stride;  // this thread's first piece of the range
    for (; i < pieces; i += stride) {
      const int64_t off = i * kPrefetchPiece;
      const auto n = static_cast<uint32_t>(min(kPrefetchPiece, r.bytes[k] - off));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(r.begin[k] + off), "r"(n) : "memory");
#endif
    }
    first += pieces;
  }
  // The chain stays ordered: the kernel after this one waits for this one, which completes only after the
  // kernel before it has (launch.cuh, PDL RULE 1).
  grid_dependency_wait();
}

}  // namespace
}  // namespace dev

void launch_l2_prefetch(const PrefetchRanges& r, cudaStream_t stream) {
  dev::Ranges d{};
  for (int k = 0; k < r.n && k < kMaxPrefetchRanges; ++k) {
    if (r.p[k] == nullptr || r.bytes[k] <= 0) continue;
    const auto a = reinterpret_cast<uintptr_t>(r.p[k]);
    const uintptr_t begin = a / 16 * 16, end = (a + static_cast<uintptr_t>(r.bytes[k]) + 15) / 16 * 16;
    d.begin[d.n] = begin;
    d.bytes[d.n] = static_cast<int64_t>(end - begin);
    ++d.n;
  }
  if (d.n == 0) return;
  launch(dev::l2_prefetch_kernel, dev::kPrefetchBlocks, dev::kPrefetchThreads, 0, stream, d);
}

}  // namespace tern::cuda
