// LibraryGemm over cuBLAS: row-major products as cuBLAS's column-major ones (y^T = W x^T), workspaces of
// our own (so that cuBLAS never allocates, also inside a graph capture), side streams for the MoE's products.
#include "backends/cuda/library_gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <map>
#include <type_traits>
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

// FP8 products with DeepSeek's block scales (fp8_block). What cuBLASLt expects, and where that is written:
// - The modes (cublasLt.h, CUDA 13.0): CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, one f32 scale per 128 elements
//   of the inner (K) dimension, and CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, one f32 scale per 128 x 128
//   block, set per operand with CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE and ..._SCALE_POINTER. Both are f32 (no
//   e8m0 form), so e8m0 weight scales are converted once at load (launch_block_scales_f32).
// - The cards: sm_90 only, from cuBLAS 12.9 (NVIDIA/CUDALibrarySamples issues #270 and #310, NVIDIA's answers:
//   "introduced in cuBLAS 12.9 ... Hopper (sm_90) only", 12.9.1 sped up the 128x128 path; sm_100+ has
//   VEC32_UE8M0 instead). PyTorch's _scaled_mm checks the same (major == 9, cublasLt >= 12.9) before its
//   "DeepSeek style" recipes. Elsewhere the heuristic finds nothing (CUBLAS_STATUS_NOT_SUPPORTED).
// - The operands: Hopper's FP8 products take the "TN" layout (K contiguous in both). So, as for bf16 (y^T = W x^T):
//   A = the weight, op T (column-major [in, out] = our row-major [out, in]) with the 128x128 scales; B = x, op N
//   (column-major [in, T] = our row-major [T, in]) with the 1x128 scales; D = y^T, column-major [out, T] = our
//   row-major y. PyTorch passes a row-major result the same way (aten cuBlasCommonArgs.h swaps the operands and
//   their scale modes), so its "block_1x128_128x128" recipe reaches cuBLASLt as exactly this; NVIDIA's
//   LtBlk128x128Fp8Matmul sample is TN too.
// - The scale layouts, from the cuBLAS docs ("Scaling factors layouts") as PyTorch PR #166752 quotes and
//   enforces them (its older checks gave silent wrong answers where K / 128 % 4 != 0), for x [M, K] and a
//   weight [N, K]: x's 1x128 scales [M, K / 128] with strides [1, M], i.e. stored [K / 128][M], tokens fastest;
//   the weight's 128x128 scales [N / 128][L4], L4 = round_up(K / 128, 4), K blocks fastest. TransformerEngine's
//   blockwise-FP8 "GEMM-ready" format (docs: FP8 Blockwise Scaling, "Swizzle of scaling factors") is the same but
//   pads the token dimension to a multiple of 4 as well ([K / 128, pad4(M)]). With T % 4 == 0 both readings are
//   one layout, so fp8_block asks for it (a caller pads the chunk) instead of guessing cuBLASLt's for other T.
// - Alignment: FP8 operands 16-byte aligned with leading dimensions a multiple of 16 bytes (the cuBLASLt FP8
//   requirements); the heuristic assumes 256-byte aligned buffers unless told less (CUBLASLT_MATMUL_PREF_MIN_
//   ALIGNMENT_*_BYTES, default 256), so each plan is made for the alignments of the pointers it serves.
// Checked on an H200 with CUDA 13.0's cuBLASLt 13.1 (2026-12-04, GpuFp8Gemm.*): f32 outputs, T = 512 and 1000
// (not a multiple of 128), K / 128 = 5 (padded weight-scale rows) and 2 groups all within 2e-4 of each output's
// magnitude of a double reference; the rates are tern_gpu_bench --only library's.
constexpr int64_t kFp8Block = 128;

// Largest power of two up to 256 dividing an address (or an address and the offsets added to it).
uint32_t alignment_bytes(uintptr_t a) {
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One shape's cuBLASLt descriptors and algorithm: making them and asking the heuristic costs tens of
// microseconds of host time, so a shape's are made once; a call only sets the scale pointers.
struct Fp8Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> more;  // the heuristic's next choices, when asked for (the algorithm sweep)
  Fp8Plan() = default;
  Fp8Plan(const Fp8Plan&) = delete;
  Fp8Plan& operator=(const Fp8Plan&) = delete;
  ~Fp8Plan() {
    if (y != nullptr) cublasLtMatrixLayoutDestroy(y);
    if (x != nullptr) cublasLtMatrixLayoutDestroy(x);
    if (w != nullptr) cublasLtMatrixLayoutDestroy(w);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// T, out, in, ldx, ldy and the alignments of x, the weight and y: what the heuristic's choice depends on.
using Fp8Key = std::array<int64_t, 8>;

// The key of fp8_block(T, out, in, ..., groups): with groups > 1 the groups' offsets (x + g in, w + g out in, y + g
// out) enter the alignments too.
Fp8Key fp8_key(int64_t T, int64_t out, int64_t in, const uint8_t* xq, int64_t ldx, const uint8_t* wq, const float* y,
               int64_t ldy, int groups) {
  const int64_t g_stride = groups > 1 ? 1 : 0;
  return {T, out, in, ldx, ldy,
          alignment_bytes(reinterpret_cast<uintptr_t>(xq) | static_cast<uintptr_t>(g_stride * in)),
          alignment_bytes(reinterpret_cast<uintptr_t>(wq) | static_cast<uintptr_t>(g_stride * out * in)),
          alignment_bytes(reinterpret_cast<uintptr_t>(y) | static_cast<uintptr_t>(g_stride * out * 4))};
}

template <typename V>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const V& v) {
  check_cublas(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)), "cublasLtMatmulDescSetAttribute");
}

template <typename V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const V& v) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)), "cublasLtMatmulPreferenceSetAttribute");
}

// Descriptors of y^T [out, T] = W [in, out]^T x^T [in, T] with the weight's 128x128 and x's 1x128 scales, and the
// heuristic's first algorithm (and up to `extra` more of its choices in `more`). The scale pointers are set before
// the heuristic (it refuses a block-scaled mode without one) and again at every call.
std::unique_ptr<Fp8Plan> make_fp8_plan(cublasLtHandle_t lt, const Fp8Key& key, const float* sw, const float* sx,
                                       int extra = 0) {
  const auto [T, out, in, ldx, ldy, align_x, align_w, align_y] = key;
  auto p = std::make_unique<Fp8Plan>();
  check_cublas(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(sw));
  set_desc(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(sx));
  check_cublas(cublasLtMatrixLayoutCreate(&p->w, CUDA_R_8F_E4M3, in, out, in), "cublasLtMatrixLayoutCreate (weight)");
  check_cublas(cublasLtMatrixLayoutCreate(&p->x, CUDA_R_8F_E4M3, in, T, ldx), "cublasLtMatrixLayoutCreate (x)");
  check_cublas(cublasLtMatrixLayoutCreate(&p->y, CUDA_R_32F, out, T, ldy), "cublasLtMatrixLayoutCreate (y)");

  cublasLtMatmulPreference_t pref = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)>
      pref_owner(pref, &cublasLtMatmulPreferenceDestroy);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(align_w));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(align_x));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(align_y));
  set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(align_y));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(1 + extra));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->w, p->x, p->y, p->y, pref, 1 + extra,
                                                           results.data(), &found);
  TERN_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no FP8 block-scaled product (1x128 x 128x128) for T = ",
             T, ", out = ", out, ", in = ", in, " (ldx ", ldx, ", ldy ", ldy, ", alignments x ", align_x, " w ", align_w,
             " y ", align_y, " bytes): ", cublasGetStatusName(st), ", ", found,
             " algorithms (these modes need an sm_90 card and cuBLAS >= 12.9)");
  p->algo = results[0].algo;
  for (int i = 1; i < found; ++i)
    if (results[static_cast<size_t>(i)].state == CUBLAS_STATUS_SUCCESS) p->more.push_back(results[static_cast<size_t>(i)].algo);
  return p;
}

bool fp8_block_available() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major == 9 && cublasLtGetVersion() >= 120900;
}

}  // namespace

// Side streams for the per-expert products: one product of a few hundred tokens fills half the machine (at
// 8 192 prompt tokens an expert's w1|w3 product is 32 x 2 tiles of 128 x 128 for 132 multiprocessors), so they
// run kSide at a time. Each side stream has its own handle and workspace (a workspace is not shared by
// kernels that may run at once).
constexpr int kSide = 4;

struct LibraryGemm::Impl {
  int nside = kSide;  // side streams made (LibraryGemm(side_streams))
  cublasHandle_t handle = nullptr;
  DeviceBuffer workspace;
  cublasHandle_t side_handle[kSide] = {};
  cudaStream_t side[kSide] = {};
  cudaEvent_t fork = nullptr, join[kSide] = {};
  DeviceBuffer side_workspace[kSide];
  // cuBLASLt for the FP8 block-scaled products. It shares `workspace` with `handle`: both issue on the stream
  // their caller passes, one call after another, as the bf16 and f32 products already share it.
  cublasLtHandle_t lt = nullptr;
  bool fp8_ok = false;
  std::map<Fp8Key, std::unique_ptr<Fp8Plan>> fp8_plans;
  explicit Impl(int side_streams) : nside(side_streams) {
    TERN_CHECK(side_streams >= 0 && side_streams <= kSide, "LibraryGemm: 0 to ", kSide, " side streams, not ",
               side_streams);
    TERN_CUBLAS(cublasCreate(&handle));
    workspace = DeviceBuffer(kWorkspaceBytes);
    TERN_CUBLAS(cublasSetWorkspace(handle, workspace.data(), kWorkspaceBytes));
    TERN_CUBLAS(cublasLtCreate(&lt));
    fp8_ok = fp8_block_available();
    TERN_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (int i = 0; i < nside; ++i) {
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
    fp8_plans.clear();
    if (lt != nullptr) cublasLtDestroy(lt);
    if (handle != nullptr) cublasDestroy(handle);
  }
  cublasHandle_t on(cudaStream_t s) {
    TERN_CUBLAS(cublasSetStream(handle, s));
    return handle;
  }
  Fp8Plan& fp8_plan(const Fp8Key& key, const float* sw, const float* sx) {
    std::unique_ptr<Fp8Plan>& p = fp8_plans[key];
    if (p == nullptr) p = make_fp8_plan(lt, key, sw, sx);
    return *p;
  }
};

LibraryGemm::LibraryGemm(int side_streams) : impl_(std::make_unique<Impl>(side_streams)) {}
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
  const int nside = impl_->nside;
  // The side streams start after everything issued on s so far, and s continues after all of them (none: s alone).
  if (nside > 0) TERN_CUDA(cudaEventRecord(impl_->fork, s));
  for (int i = 0; i < nside; ++i) TERN_CUDA(cudaStreamWaitEvent(impl_->side[i], impl_->fork, 0));
  int next = 0;
  for (const GroupedProblem& p : problems) {
    if (p.n <= 0) continue;
    cublasHandle_t h = nside > 0 ? impl_->side_handle[next] : impl_->on(s);
    if (nside > 0) next = (next + 1) % nside;
    TERN_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, mi, p.n, ki, &p.alpha, p.a, CUDA_R_16BF, la, p.b, CUDA_R_16BF,
                             lb, &beta, p.c, CUDA_R_32F, lc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  for (int i = 0; i < nside; ++i) {
    TERN_CUDA(cudaEventRecord(impl_->join[i], impl_->side[i]));
    TERN_CUDA(cudaStreamWaitEvent(s, impl_->join[i], 0));
  }
}

bool LibraryGemm::fp8_block_supported() const { return impl_->fp8_ok; }

int64_t LibraryGemm::fp8_weight_scale_ld(int64_t in) { return ((in + kFp8Block - 1) / kFp8Block + 3) / 4 * 4; }

namespace {

// fp8_block's preconditions, each with the value that breaks it.
void check_fp8_args(int64_t T, int64_t out, int64_t in, const uint8_t* xq, int64_t ldx, const float* sx,
                    const uint8_t* wq, const float* sw, float* y, int64_t ldy, int groups) {
  TERN_CHECK(groups >= 1, "library FP8 GEMM: groups = ", groups, ", expected >= 1");
  TERN_CHECK(in > 0 && in % kFp8Block == 0 && out > 0 && out % kFp8Block == 0, "library FP8 GEMM: out = ", out,
             ", in = ", in, " (per group): both must be positive multiples of 128 (whole 128x128 scale blocks)");
  TERN_CHECK(T % LibraryGemm::kFp8TokenMultiple == 0, "library FP8 GEMM: T = ", T,
             " tokens, expected a multiple of 4: the 1x128 scales are read as [in / 128][T] rows, whose layout "
             "cuBLASLt documents only with T % 4 == 0; pad the chunk (x, sx and y) to a multiple of 4 rows");
  TERN_CHECK(ldx % 16 == 0 && ldx >= groups * in, "library FP8 GEMM: ldx = ", ldx,
             " bytes, expected a multiple of 16 and >= ", groups * in);
  TERN_CHECK(ldy % 4 == 0 && ldy >= groups * out, "library FP8 GEMM: ldy = ", ldy,
             " floats, expected a multiple of 4 and >= ", groups * out);
  TERN_CHECK(aligned16(xq) && aligned16(wq) && aligned16(sx) && aligned16(sw) && aligned16(y),
             "library FP8 GEMM: x, the weight, their scales and y must be 16-byte aligned (x ", static_cast<const void*>(xq),
             ", w ", static_cast<const void*>(wq), ", sx ", static_cast<const void*>(sx), ", sw ",
             static_cast<const void*>(sw), ", y ", static_cast<const void*>(y), ")");
}

}  // namespace

// One cuBLASLt call per group: its strided batches would need the scale tensors' batch strides, which the
// block-scaling modes do not document. The groups run on the side streams, kSide at a time (each with its own
// workspace), as bf16_each's experts do: one group of wo_a at 1K tokens is 8 x 8 tiles of 128 x 128 for 132
// multiprocessors, so in series the 8 groups left half the card idle (session 20, H100: 340 TFLOP/s, 47% of
// cuBLAS bf16 on the whole shape). Each group's call is the same as in series: the same bits.
void LibraryGemm::fp8_block(cudaStream_t s, int64_t T, int64_t out, int64_t in, const uint8_t* xq, int64_t ldx,
                            const float* sx, const uint8_t* wq, const float* sw, float* y, int64_t ldy, int groups) {
  if (T == 0) return;
  TERN_CHECK(impl_->fp8_ok, "library FP8 GEMM: cuBLASLt's block-scaled FP8 products need a compute capability 9.x "
             "card and cuBLASLt >= 12.9 (this one: cuBLASLt ", cublasLtGetVersion(), ")");
  check_fp8_args(T, out, in, xq, ldx, sx, wq, sw, y, ldy, groups);
  Fp8Plan& p = impl_->fp8_plan(fp8_key(T, out, in, xq, ldx, wq, y, ldy, groups), sw, sx);
  const int64_t sw_group = out / kFp8Block * fp8_weight_scale_ld(in), sx_group = in / kFp8Block * T;
  const float alpha = 1.0f, beta = 0.0f;
  const int sides = groups > 1 ? std::min(groups, impl_->nside) : 0;
  if (sides > 0) {  // the side streams start after everything issued on s so far
    TERN_CUDA(cudaEventRecord(impl_->fork, s));
    for (int i = 0; i < sides; ++i) TERN_CUDA(cudaStreamWaitEvent(impl_->side[i], impl_->fork, 0));
  }
  for (int g = 0; g < groups; ++g) {
    const float* swg = sw + g * sw_group;
    const float* sxg = sx + g * sx_group;
    // The descriptor is read when the call is issued, so the next group may set its own pointers after it.
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(swg));
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(sxg));
    float* yg = y + g * out;
    cudaStream_t gs = sides > 0 ? impl_->side[g % sides] : s;
    void* ws = sides > 0 ? impl_->side_workspace[g % sides].data() : impl_->workspace.data();
    check_cublas(cublasLtMatmul(impl_->lt, p.desc, &alpha, wq + g * out * in, p.w, xq + g * in, p.x, &beta, yg, p.y, yg,
                                p.y, &p.algo, ws, kWorkspaceBytes, gs),
                 "cublasLtMatmul (FP8 block-scaled)");
  }
  for (int i = 0; i < sides; ++i) {  // s continues after every group
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

namespace {

// Random e4m3 operands of fp8_block(T, out, in, groups) with unit scales (e8m0 127 = 1.0, through the load-time
// conversion) in device memory: only timings are taken on them.
struct Fp8Operands {
  DeviceBuffer x, w, sx, sw, y, ones;
  Fp8Operands(cudaStream_t s, int64_t T, int64_t out, int64_t in, int groups) {
    const int64_t ld = LibraryGemm::fp8_weight_scale_ld(in), sx_n = groups * in / kFp8Block * T,
                  sw_n = groups * out / kFp8Block * ld;
    x = DeviceBuffer(static_cast<size_t>(T * groups * in));
    w = DeviceBuffer(static_cast<size_t>(groups * out * in));
    sx = DeviceBuffer(static_cast<size_t>(sx_n) * 4);
    sw = DeviceBuffer(static_cast<size_t>(sw_n) * 4);
    y = DeviceBuffer(static_cast<size_t>(T * groups * out) * 4);
    ones = DeviceBuffer(static_cast<size_t>(std::max(sx_n, sw_n)));
    launch_fill_random_e4m3(static_cast<uint8_t*>(x.data()), T * groups * in, 31, s);
    launch_fill_random_e4m3(static_cast<uint8_t*>(w.data()), groups * out * in, 32, s);
    TERN_CUDA(cudaMemsetAsync(ones.data(), 127, ones.size(), s));
    launch_block_scales_f32(ones.data(), false, groups * in / kFp8Block, T, T, static_cast<float*>(sx.data()), s);
    launch_block_scales_f32(ones.data(), false, groups * out / kFp8Block, in / kFp8Block, ld,
                            static_cast<float*>(sw.data()), s);
    check_launch("fill_random_e4m3 / block_scales_f32");
  }
  const uint8_t* xq() const { return static_cast<const uint8_t*>(x.data()); }
  const uint8_t* wq() const { return static_cast<const uint8_t*>(w.data()); }
  const float* sxp() const { return static_cast<const float*>(sx.data()); }
  const float* swp() const { return static_cast<const float*>(sw.data()); }
  float* yp() const { return static_cast<float*>(y.data()); }
};

}  // namespace

double LibraryGemm::time_fp8_block_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, int reps, int groups) {
  const Fp8Operands o(s, T, out, in, groups);
  const Timing t = time_device(
      [&] { fp8_block(s, T, out, in, o.xq(), groups * in, o.sxp(), o.wq(), o.swp(), o.yp(), groups * out, groups); },
      2, reps);
  return t.median_us;
}

std::vector<double> LibraryGemm::time_fp8_block_algos_us(cudaStream_t s, int64_t T, int64_t out, int64_t in, int reps,
                                                         int max_algos) {
  TERN_CHECK(impl_->fp8_ok, "library FP8 GEMM: no block-scaled FP8 products on this card / cuBLASLt");
  const Fp8Operands o(s, T, out, in, 1);
  const std::unique_ptr<Fp8Plan> p = make_fp8_plan(impl_->lt, fp8_key(T, out, in, o.xq(), in, o.wq(), o.yp(), out, 1),
                                                   o.swp(), o.sxp(), std::max(0, max_algos - 1));
  std::vector<cublasLtMatmulAlgo_t> algos{p->algo};
  algos.insert(algos.end(), p->more.begin(), p->more.end());
  std::vector<double> us;
  const float alpha = 1.0f, beta = 0.0f;
  for (const cublasLtMatmulAlgo_t& algo : algos) {
    const Timing t = time_device(
        [&] {
          check_cublas(cublasLtMatmul(impl_->lt, p->desc, &alpha, o.wq(), p->w, o.xq(), p->x, &beta, o.yp(), p->y,
                                      o.yp(), p->y, &algo, impl_->workspace.data(), kWorkspaceBytes, s),
                       "cublasLtMatmul (FP8 block-scaled, algorithm sweep)");
        },
        2, reps);
    us.push_back(t.median_us);
  }
  return us;
}

}  // namespace tern::cuda
