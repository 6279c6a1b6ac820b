// LibraryGemm over cuBLAS: row-major products as cuBLAS's column-major ones (y^T = W x^T), workspaces of
// our own (so that cuBLAS never allocates, also inside a graph capture), side streams for the MoE's products.
#include "backends/cuda/library_gemm.h"

#include <cublas_v2.h>

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/gemm_prep.cuh"
#include "backends/cuda/timing.h"
#include "core/error.h"

namespace tern::cuda {

namespace {

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in ", what, ": ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}
#define TERN_CUBLAS(call) check_cublas((call), #call)

int narrow(int64_t v, const char* what) {
  TERN_CHECK(v >= 0 && v <= INT32_MAX, "library GEMM: ", what, " = ", v, " does not fit cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

// cuBLAS's recommended workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

}  // namespace

// Side streams for the per-expert products: one product of a few hundred tokens fills half the machine (at
// 8 192 prompt tokens an expert's w1|w3 product is 32 x 2 tiles of 128 x 128 for 132 multiprocessors), so they
// run kSide at a time. Each side stream has its own handle and workspace (a workspace is not shared by
// kernels that may run at once).
constexpr int kSide = 4;

struct LibraryGemm::Impl {
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  cublasHandle_t side_handle[kSide] = {};
  cudaStream_t side[kSide] = {};
  cudaEvent_t fork = nullptr, join[kSide] = {};
  DeviceBuffer side_workspace[kSide];
  Impl() {
    TERN_CUBLAS(cublasCreate(&handle));
    workspace = DeviceBuffer(kWorkspaceBytes);
    TERN_CUBLAS(cublasSetWorkspace(handle, workspace.data(), kWorkspaceBytes));
    TERN_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int i = 0; i < kSide; ++i) {
      TERN_CUDA(cudaStreamCreateWithFlags(&side[i], cudaStreamNonBlocking));
      TERN_CUDA(cudaEventCreateWithFlags(&join[i], cudaEventDisableTiming));
      TERN_CUBLAS(cublasCreate(&side_handle[i]));
      side_workspace[i] = DeviceBuffer(kWorkspaceBytes);
      TERN_CUBLAS(cublasSetWorkspace(side_handle[i], side_workspace[i].data(), kWorkspaceBytes));
      TERN_CUBLAS(cublasSetStream(side_handle[i], side[i]));
    }
  }
  ~Impl() {
    for (int i = 0; i < kSide; ++i) {
      if (side_handle[i] != nullptr) cublasDestroy(side_handle[i]);
      if (side[i] != nullptr) cudaStreamDestroy(side[i]);
      if (join[i] != nullptr) cudaEventDestroy(join[i]);
    }
    if (fork != nullptr) cudaEventDestroy(fork);
    if (handle != nullptr) cublasDestroy(handle);
  }
  cublasHandle_t on(cudaStream_t s) {
    TERN_CUBLAS(cublasSetStream(handle, s));
    return handle;
  }
};

LibraryGemm::LibraryGemm() : impl_(std::make_unique<Impl>()) {}
LibraryGemm::~LibraryGemm() = default;

namespace {

// y^T [out, T] = W [in, out]^T x^T [in, T] in cuBLAS's column-major terms, once or strided batched.
void gemm(cublasHandle_t h, int64_t T, int64_t out, int64_t in, const void* x, int64_t ldx, const void* w, int64_t ldw,
          float* y, int64_t ldy, float alpha, GemmBatch b, cudaDataType_t in_type, cublasComputeType_t compute,
          float beta = 0.0f) {
  if (T == 0) return;
  const int m = narrow(out, "out"), n = narrow(T, "tokens"), k = narrow(in, "in");
  if (b.batch == 1) {
    TERN_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in_type, narrow(ldw, "ldw"), x, in_type,
                             narrow(ldx, "ldx"), &beta, y, CUDA_R_32F, narrow(ldy, "ldy"), compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  TERN_CUBLAS(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in_type, narrow(ldw, "ldw"),
                                         b.w_stride, x, in_type, narrow(ldx, "ldx"), b.x_stride, &beta, y, CUDA_R_32F,
                                         narrow(ldy, "ldy"), b.y_stride, b.batch, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void LibraryGemm::bf16(cudaStream_t s, int64_t T, int64_t out, int64_t in, const void* x, int64_t ldx, const void* w,
                       int64_t ldw, float* y, int64_t ldy, float alpha, GemmBatch b, float beta) {
  gemm(impl_->on(s), T, out, in, x, ldx, w, ldw, y, ldy, alpha, b, CUDA_R_16BF, CUBLAS_COMPUTE_32F, beta);
}

// CUBLAS_COMPUTE_32F_PEDANTIC: f32 products and sums, never TF32 (the exact path: top-k choices).
void LibraryGemm::f32(cudaStream_t s, int64_t T, int64_t out, int64_t in, const float* x, int64_t ldx, const float* w,
                      int64_t ldw, float* y, int64_t ldy, GemmBatch b) {
  gemm(impl_->on(s), T, out, in, x, ldx, w, ldw, y, ldy, 1.0f, b, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC);
}

void LibraryGemm::bf16_each(cudaStream_t s, std::span<const GroupedProblem> problems, int64_t m, int64_t k,
                            int64_t lda, int64_t ldb, int64_t ldc) {
  const int mi = narrow(m, "m"), ki = narrow(k, "k"), la = narrow(lda, "lda"), lb = narrow(ldb, "ldb"),
            lc = narrow(ldc, "ldc");
  const float beta = 0.0f;
  // The side streams start after everything issued on s so far, and s continues after all of them.
  TERN_CUDA(cudaEventRecord(impl_->fork, s));
  for (int i = 0; i < kSide; ++i) TERN_CUDA(cudaStreamWaitEvent(impl_->side[i], impl_->fork, 0));
  int next = 0;
  for (const GroupedProblem& p : problems) {
    if (p.n <= 0) continue;
    cublasHandle_t h = impl_->side_handle[next];
    next = (next + 1) % kSide;
    TERN_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, mi, p.n, ki, &p.alpha, p.a, CUDA_R_16BF, la, p.b, CUDA_R_16BF,
                             lb, &beta, p.c, CUDA_R_32F, lc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  for (int i = 0; i < kSide; ++i) {
    TERN_CUDA(cudaEventRecord(impl_->join[i], impl_->side[i]));
    TERN_CUDA(cudaStreamWaitEvent(s, impl_->join[i], 0));
  }
}

double LibraryGemm::time_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, bool f32, int reps) {
  const size_t es = f32 ? 4 : 2;
  DeviceBuffer x(static_cast<size_t>(T * in) * es), w(static_cast<size_t>(out * in) * es),
      y(static_cast<size_t>(T * out) * 4);
  // f32 operands: pairs of random bf16 read as one float each (finite, varied; only the timing matters).
  launch_fill_random_bf16(static_cast<uint16_t*>(x.data()), T * in * static_cast<int64_t>(es / 2), 1.0f, 21, s);
  launch_fill_random_bf16(static_cast<uint16_t*>(w.data()), out * in * static_cast<int64_t>(es / 2), 0.02f, 22, s);
  check_launch("fill_random_bf16");
  auto* yp = static_cast<float*>(y.data());
  const Timing t = time_device(
      [&] {
        if (f32)
          this->f32(s, T, out, in, static_cast<const float*>(x.data()), in, static_cast<const float*>(w.data()), in,
                    yp, out);
        else
          bf16(s, T, out, in, x.data(), in, w.data(), in, yp, out);
      },
      2, reps);
  return t.median_us;
}

double LibraryGemm::time_moe_us(cudaStream_t s, int64_t T, int64_t E, int64_t k, int64_t D, int64_t inter, int reps) {
  const int64_t P = T * k, per = P / E, copies = std::min<int64_t>(E, 32);
  const size_t elems = static_cast<size_t>(inter * D);
  DeviceBuffer w(copies * 3 * elems * 2), xs(static_cast<size_t>(P * D) * 2), h13(static_cast<size_t>(P * 2 * inter) * 4),
      h(static_cast<size_t>(P * inter) * 2), y(static_cast<size_t>(P * D) * 4);
  launch_fill_random_bf16(static_cast<uint16_t*>(w.data()), static_cast<int64_t>(copies * 3 * elems), 0.02f, 23, s);
  launch_fill_random_bf16(static_cast<uint16_t*>(xs.data()), P * D, 1.0f, 24, s);
  launch_fill_random_bf16(static_cast<uint16_t*>(h.data()), P * inter, 1.0f, 25, s);
  check_launch("fill_random_bf16");
  std::vector<GroupedProblem> up, down;
  const auto* wb = static_cast<const uint16_t*>(w.data());
  const auto* xb = static_cast<const uint16_t*>(xs.data());
  const auto* hb = static_cast<const uint16_t*>(h.data());
  for (int64_t e = 0; e < E; ++e) {
    const uint16_t* we = wb + (e % copies) * 3 * elems;
    up.push_back({we, xb + e * per * D, static_cast<float*>(h13.data()) + e * per * 2 * inter, static_cast<int>(per), 1.0f});
    down.push_back({we + 2 * elems, hb + e * per * inter, static_cast<float*>(y.data()) + e * per * D,
                    static_cast<int>(per), 1.0f});
  }
  const Timing t = time_device(
      [&] {
        bf16_each(s, up, 2 * inter, D, D, D, 2 * inter);
        bf16_each(s, down, D, inter, inter, inter, D);
      },
      2, reps);
  return t.median_us;
}

}  // namespace tern::cuda
