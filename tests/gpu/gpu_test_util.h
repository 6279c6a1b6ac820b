// Helpers of the GPU op tests: each op runs on the CPU backend (the reference) and on the CUDA backend
// with the same fresh random inputs (never zeros); GPU outputs are poisoned (NaN bytes) before the run
// and must come back fully written; errors are normalised, ||gpu - ref|| / ||ref||, with the thresholds
// of the GPU machine's METHOD.md (f32 arithmetic far under 1e-3, bf16 operands under 1e-2).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/device_memory.h"
#include "core/paged_rows.h"
#include "core/tensor.h"
#include "ops/kv_row.h"
#include "ops/moe.h"
#include "ops/weight.h"

namespace tern::gputest {

// Sets the CUDA backend up once (cuda::register_backend); false when there is no usable CUDA device.
bool gpu_ready();

// GPU tests call this first: with no device the test is reported SKIPPED, never passed.
#define TERN_REQUIRE_GPU()                                                              \
  do {                                                                                  \
    if (!::tern::gputest::gpu_ready()) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)

// Sets programmatic dependent launch (cuda::set_pdl_enabled, kernels/pdl.cuh) for a scope, then restores it.
class PdlGuard {
 public:
  explicit PdlGuard(bool on);
  ~PdlGuard();
  PdlGuard(const PdlGuard&) = delete;
  PdlGuard& operator=(const PdlGuard&) = delete;

 private:
  bool saved_;
};

// Sets the token count from which FP4 experts take the grouped kernels (CudaBackend::set_moe_grouped_min_tokens)
// for a scope, then restores it. Tests of the decode kernels and of batch invariance below the library threshold
// hold it at kLibraryMinTokens: the grouped kernels from 65 tokens (the default) are a path switch by token count,
// as the library products from 512, and `--batch-invariant` is what turns both off.
class MoeGroupedMinTokensGuard {
 public:
  explicit MoeGroupedMinTokensGuard(int64_t tokens);
  ~MoeGroupedMinTokensGuard();
  MoeGroupedMinTokensGuard(const MoeGroupedMinTokensGuard&) = delete;
  MoeGroupedMinTokensGuard& operator=(const MoeGroupedMinTokensGuard&) = delete;

 private:
  int64_t saved_;
};

// One of the CUDA backend's switches (CudaBackend::set_knob, by its TERN_* name) at `value` for the guard's
// lifetime, then back to what it was: e.g. the dense products kept off the library below 512 tokens in a batch
// invariance test (TERN_DENSE_LIBRARY_MIN_TOKENS, 65 by default since session 22).
class KnobGuard {
 public:
  KnobGuard(std::string name, int64_t value);
  ~KnobGuard();
  KnobGuard(const KnobGuard&) = delete;
  KnobGuard& operator=(const KnobGuard&) = delete;

 private:
  std::string name_;
  int64_t saved_;
};

// Ops captured into a CUDA graph on a private stream (the backend's stream switched to it for the capture), then
// replayed there, as a recorded step runs them. The ops' scratch and tables must exist (run them eagerly first).
class CapturedOps {
 public:
  explicit CapturedOps(const std::function<void()>& launch);
  ~CapturedOps();
  CapturedOps(const CapturedOps&) = delete;
  CapturedOps& operator=(const CapturedOps&) = delete;
  const std::string& error() const { return error_; }  // empty when the capture worked
  // Launches the graph and waits for it; the CUDA error's name, or empty.
  std::string replay();

 private:
  void* stream_ = nullptr;  // cudaStream_t, cudaGraph_t, cudaGraphExec_t (no CUDA header here)
  void* graph_ = nullptr;
  void* exec_ = nullptr;
  std::string error_;
};

constexpr double kTolF32 = 1e-5;   // f32 arithmetic, other summation order
constexpr double kTolBf16 = 1e-2;  // bf16 operands (tensor-core products)

class Rand {
 public:
  explicit Rand(uint64_t seed) : gen_(seed), state_(seed) {}
  float fast(float stddev = 1.0f);  // never exactly zero in practice; cheap
  float normal(float stddev = 1.0f) { return std::normal_distribution<float>(0.0f, stddev)(gen_); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  int64_t index(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(gen_); }
  uint64_t bits() { return gen_(); }

 private:
  std::mt19937_64 gen_;
  uint64_t state_;
};

// A fresh seed per test (the test's name hashed with a per-run counter), printed on failure by the caller.
uint64_t fresh_seed();

Tensor random_f32(Shape shape, Rand& r, float stddev = 1.0f);
// Each of T tokens' k distinct experts of E, uniformly at random (i32 [T, k]).
Tensor random_picks(int64_t T, int64_t E, int64_t k, Rand& r);
Tensor random_bf16(Shape shape, Rand& r, float stddev = 1.0f);

// A host weight in one checkpoint format with random contents (value std about `stddev`), owning its data.
struct HostWeight {
  ops::Weight w;
  Tensor weight, scale;
};
HostWeight random_weight(ops::WeightFormat f, int64_t out, int64_t in, Rand& r, float stddev, const char* name);

// E random routed experts of format f (w1, w3 [inter, D], w2 [D, inter]), as the host reference and the
// device see them.
struct RandomExperts {
  std::vector<HostWeight> host;  // w1, w2, w3 of each expert
  std::vector<ops::Expert> on_host, on_device;
  cuda::WeightStore store;
  RandomExperts(ops::WeightFormat f, int64_t E, int64_t D, int64_t inter, Rand& r);
};

// Device copy of a host tensor, and a device tensor poisoned with 0xff bytes (NaN for f32).
cuda::DeviceTensor upload(const TensorView& host);
// A tensor's address as the step ops' address tables hold it, and a host i64 [n] table of such words.
int64_t addr(const TensorView& t);
Tensor i64(const std::vector<int64_t>& v);
cuda::DeviceTensor poisoned(DType dtype, Shape shape);

// Rows (host, [n, ...]) in pages as the state pool holds them: rows_per_page per page at a byte offset,
// the pages in shuffled order among spare ones filled with noise. `host` is that on the host (the CPU
// reference reads it), `device` the same pages and block table in device memory.
struct PagedPair {
  Tensor host_pool, host_table;
  cuda::DeviceTensor device_pool, device_table;
  PagedRows host, device;
};
PagedPair paged_pair(const TensorView& rows, int64_t rows_per_page, Rand& r);

// Whether the CUDA sparse attention runs on tensor cores (bf16 operands: tolerance kTolBf16) for rows of
// format f and `heads` heads, or on the exact f32 path (kTolF32).
bool attention_on_tensor_cores(const ops::KvRowFormat& f, int64_t heads);

struct Compare {
  double rel_err = 0.0;   // ||gpu - ref|| / ||ref||
  int64_t bad = 0;        // NaN / inf in the GPU output (unwritten or broken) where ref is finite
  double ref_norm = 0.0;
};
Compare compare(const TensorView& gpu_device, const TensorView& ref_host);

// EXPECTs that the rows of a product of all N tokens of `x` (host [N, in]) by the device weight `w` equal, bit for
// bit, the same rows computed in batches of 1, 3, 16 and 64 at random offsets (other token tiles, K splits, n-tile
// counts): a token's output must not depend on what shares its step. `what` names the case.
void expect_linear_batch_invariant(const Tensor& x, const ops::Weight& w, Rand& r, const std::string& what);

// EXPECTs: fully written and rel_err <= tol; `what` names the case. Records the error as a test property.
void expect_close(const TensorView& gpu_device, const TensorView& ref_host, double tol, const std::string& what);

}  // namespace tern::gputest
