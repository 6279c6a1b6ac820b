#include "gpu_test_util.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/pdl.cuh"
#include "core/dtype.h"
#include "ops/linear.h"

namespace tern::gputest {

bool gpu_ready() {
  static const bool ready = [] {
    if (!cuda::device_available()) return false;
    cuda::register_backend();
    return true;
  }();
  return ready;
}

CapturedOps::CapturedOps(const std::function<void()>& launch) {
  cuda::CudaBackend& be = cuda::register_backend();
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    error_ = "cudaStreamCreate failed";
    return;
  }
  stream_ = stream;
  be.synchronize();
  void* const previous = be.stream();
  be.set_stream(stream);
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    launch();
    e = cudaStreamEndCapture(stream, &graph);
  }
  be.set_stream(previous);
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  exec_ = exec;
  if (e != cudaSuccess) error_ = cudaGetErrorName(e);
}

CapturedOps::~CapturedOps() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

std::string CapturedOps::replay() {
  if (!error_.empty()) return error_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorName(e));
}

PdlGuard::PdlGuard(bool on) : saved_(cuda::pdl_enabled()) { cuda::set_pdl_enabled(on); }
PdlGuard::~PdlGuard() { cuda::set_pdl_enabled(saved_); }

KnobGuard::KnobGuard(std::string name, int64_t value)
    : name_(std::move(name)), saved_(cuda::register_backend().knob(name_)) {
  cuda::register_backend().set_knob(name_, value);
}

KnobGuard::~KnobGuard() { cuda::register_backend().set_knob(name_, saved_); }

MoeGroupedMinTokensGuard::MoeGroupedMinTokensGuard(int64_t tokens)
    : saved_(cuda::register_backend().moe_grouped_min_tokens()) {
  cuda::register_backend().set_moe_grouped_min_tokens(tokens);
}
MoeGroupedMinTokensGuard::~MoeGroupedMinTokensGuard() { cuda::register_backend().set_moe_grouped_min_tokens(saved_); }

uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "?";
  const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const uint64_t seed = std::hash<std::string>{}(name) ^ (now * 0x9e3779b97f4a7c15ull) ^ counter++;
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

float Rand::fast(float stddev) {
  // Uniform on [-sqrt(3), sqrt(3)) * stddev from 24 random bits (std = stddev); fast enough for the
  // gigabyte-sized weights of the real shapes.
  state_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (static_cast<float>(z >> 40) * 0x1p-24f * 2.0f - 1.0f) * 1.7320508f * stddev;
}

Tensor random_f32(Shape shape, Rand& r, float stddev) {
  Tensor t(DType::f32, shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = r.fast(stddev);
  return t;
}

Tensor random_picks(int64_t T, int64_t E, int64_t k, Rand& r) {
  Tensor idx(DType::i32, {T, k});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < k; ++j) std::swap(all[j], all[j + r.index(E - j)]);
    std::copy_n(all.begin(), k, idx.data<int32_t>() + t * k);
  }
  return idx;
}

Tensor random_bf16(Shape shape, Rand& r, float stddev) {
  Tensor t(DType::bf16, shape);
  auto* p = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(r.fast(stddev));
  return t;
}

HostWeight random_weight(ops::WeightFormat f, int64_t out, int64_t in, Rand& r, float stddev, const char* name) {
  HostWeight h;
  ops::Weight& w = h.w;
  w.format = f;
  w.out = out;
  w.in = in;
  w.name = name;
  switch (f) {
    case ops::WeightFormat::f32: h.weight = random_f32({out, in}, r, stddev); break;
    case ops::WeightFormat::bf16: h.weight = random_bf16({out, in}, r, stddev); break;
    case ops::WeightFormat::fp8_block: {
      // e4m3 values of a normal with std 64 (so subnormals, large values and saturation all occur), and
      // power-of-two block scales around stddev / 64.
      h.weight = Tensor(DType::e4m3, {out, in});
      auto* q = h.weight.data<uint8_t>();
      for (int64_t i = 0; i < out * in; ++i) q[i] = f32_to_e4m3(r.fast(64.0f));
      h.scale = Tensor(DType::e8m0, {(out + 127) / 128, (in + 127) / 128});
      auto* s = h.scale.data<uint8_t>();
      const int base = static_cast<int>(std::floor(std::log2(stddev / 64.0f)));
      for (int64_t i = 0; i < h.scale.numel(); ++i) s[i] = static_cast<uint8_t>(127 + base + r.index(3) - 1);
      break;
    }
    case ops::WeightFormat::mxfp4:
    case ops::WeightFormat::nvfp4: {
      const bool mx = f == ops::WeightFormat::mxfp4;
      h.weight = Tensor(DType::u8, {out, in / 2});
      auto* q = h.weight.data<uint8_t>();
      for (int64_t i = 0; i < out * in / 2; ++i) q[i] = static_cast<uint8_t>(r.bits());
      const int64_t block = mx ? 32 : 16;
      h.scale = Tensor(mx ? DType::e8m0 : DType::ue4m3, {out, in / block});
      auto* s = h.scale.data<uint8_t>();
      if (mx) {
        const int base = static_cast<int>(std::floor(std::log2(stddev / 3.0f)));
        for (int64_t i = 0; i < h.scale.numel(); ++i) s[i] = static_cast<uint8_t>(127 + base + r.index(3) - 1);
      } else {
        for (int64_t i = 0; i < h.scale.numel(); ++i) s[i] = f32_to_ue4m3(r.uniform(0.001f, 448.0f));
        w.global_scale = stddev / 3.0f / 200.0f;
      }
      break;
    }
  }
  w.weight = h.weight.view();
  if (!h.scale.empty()) w.scale = h.scale.view();
  return h;
}

int64_t addr(const TensorView& t) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data())); }

Tensor i64(const std::vector<int64_t>& v) {
  Tensor t(DType::i64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

cuda::DeviceTensor upload(const TensorView& host) { return cuda::to_device(host); }

cuda::DeviceTensor poisoned(DType dtype, Shape shape) {
  cuda::DeviceTensor t(dtype, shape);
  cuda::fill_bytes(t.view(), 0xff);
  return t;
}

PagedPair paged_pair(const TensorView& rows, int64_t rows_per_page, Rand& r) {
  const int64_t n = rows.dim(0), row_bytes = static_cast<int64_t>(rows.nbytes()) / std::max<int64_t>(1, n);
  const int64_t used = std::max<int64_t>(1, (n + rows_per_page - 1) / rows_per_page), pages = used + 3;
  const int64_t offset = 64, page_bytes = (offset + rows_per_page * row_bytes + 64 + 255) / 256 * 256;
  PagedPair p;
  p.host_pool = Tensor(DType::u8, {pages, page_bytes});
  for (int64_t i = 0; i < p.host_pool.numel(); ++i) p.host_pool.data<uint8_t>()[i] = static_cast<uint8_t>(r.bits());
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[static_cast<size_t>(r.index(static_cast<int64_t>(i)))]);
  p.host_table = Tensor(DType::i32, {used});
  std::copy_n(order.begin(), used, p.host_table.data<int32_t>());
  p.host = {p.host_pool, p.host_table, offset, rows_per_page, row_bytes};
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(p.host.row(i), rows.data_as<const std::byte>() + i * row_bytes, static_cast<size_t>(row_bytes));
  p.device_pool = upload(p.host_pool);
  p.device_table = upload(p.host_table);
  p.device = {p.device_pool.view(), p.device_table.view(), offset, rows_per_page, row_bytes};
  return p;
}

bool attention_on_tensor_cores(const ops::KvRowFormat& f, int64_t heads) {
  cuda::AttentionParams p;
  p.heads = heads;
  p.fmt = {f.format == ops::KvFormat::fp8_ds ? 1 : 0, f.head_dim, f.rope_dim, f.row_bytes()};
  return cuda::attention_path(p) != cuda::AttentionPath::f32_cuda_cores;
}

Compare compare(const TensorView& gpu_device, const TensorView& ref_host) {
  Compare c;
  const Tensor got = cuda::to_host(gpu_device);
  EXPECT_EQ(got.shape(), ref_host.shape());
  if (got.shape() != ref_host.shape()) return c;
  const float* g = got.data<float>();
  const float* r = ref_host.data_as<const float>();
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (!std::isfinite(r[i])) continue;
    if (!std::isfinite(g[i])) {
      ++c.bad;
      continue;
    }
    diff += (static_cast<double>(g[i]) - r[i]) * (static_cast<double>(g[i]) - r[i]);
    norm += static_cast<double>(r[i]) * r[i];
  }
  c.ref_norm = std::sqrt(norm);
  c.rel_err = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return c;
}

void expect_close(const TensorView& gpu_device, const TensorView& ref_host, double tol, const std::string& what) {
  const Compare c = compare(gpu_device, ref_host);
  EXPECT_EQ(c.bad, 0) << what << ": " << c.bad << " output values unwritten or not finite";
  EXPECT_GT(c.ref_norm, 0.0) << what << ": the reference is all zeros (the test's inputs are degenerate)";
  EXPECT_LE(c.rel_err, tol) << what << ": normalised error " << c.rel_err << " over " << tol;
  std::printf("  %-48s rel_err %.3e (tol %.0e)\n", what.c_str(), c.rel_err, tol);
}

RandomExperts::RandomExperts(ops::WeightFormat f, int64_t E, int64_t D, int64_t inter, Rand& r) {
  for (int64_t e = 0; e < E; ++e) {
    host.push_back(random_weight(f, inter, D, r, 2.0f / std::sqrt(static_cast<float>(D)), "w1"));
    host.push_back(random_weight(f, D, inter, r, 1.0f / std::sqrt(static_cast<float>(inter)), "w2"));
    host.push_back(random_weight(f, inter, D, r, 2.0f / std::sqrt(static_cast<float>(D)), "w3"));
  }
  for (int64_t e = 0; e < E; ++e) {
    on_host.push_back(ops::Expert{host[3 * e].w, host[3 * e + 1].w, host[3 * e + 2].w});
    on_device.push_back(ops::Expert{store.upload(on_host[e].w1), store.upload(on_host[e].w2), store.upload(on_host[e].w3)});
  }
}

void expect_linear_batch_invariant(const Tensor& x, const ops::Weight& w, Rand& r, const std::string& what) {
  const int64_t N = x.dim(0), in = x.dim(1), out = w.out;
  auto dx = upload(x), yall = poisoned(DType::f32, {N, out});
  ops::linear(cuda::context(), dx, w, yall);
  const Tensor all = cuda::to_host(yall);
  for (const int64_t T : {1, 3, 16, 64}) {
    if (T > N) continue;
    const int64_t off = r.index(N - T + 1);
    Tensor xs(DType::f32, {T, in});
    std::memcpy(xs.data<float>(), x.data<float>() + off * in, T * in * sizeof(float));
    auto dxs = upload(xs), ys = poisoned(DType::f32, {T, out});
    ops::linear(cuda::context(), dxs, w, ys);
    const Tensor part = cuda::to_host(ys);
    int64_t differ = 0;
    for (int64_t i = 0; i < T * out; ++i)
      if (std::memcmp(part.data<float>() + i, all.data<float>() + off * out + i, 4) != 0) ++differ;
    EXPECT_EQ(differ, 0) << what << ": " << differ << " outputs of tokens " << off << ".." << off + T - 1
                         << " differ between a batch of " << T << " and the batch of " << N;
  }
}

}  // namespace tern::gputest
