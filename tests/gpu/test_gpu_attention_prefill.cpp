// GPU vs CPU: the prefill attention kernels (attention_prefill_kernel, version 1, and
// attention_prefill_wgmma_kernel, versions 2 and 3: one block per query over all its keys)
// on fresh random chunks at the V4-Flash shapes (64 heads, head_dim 512, window 128; CSA ratio 4 with 512
// picks, HCA ratio 128 with every compressed row) and the fixture's, at n = 1, 7, 64 and 600 queries whose
// windows lie partly in the ring and partly in the chunk, with masked (-1) picks among real ones, queries
// with no pick at all and chunks that see fewer compressed rows than picks (a -1 tail). The kernel is
// launched directly (the op sends it only chunks of >= 512 queries), checked against the CPU's
// sparse_attention and against the decode kernel (attention_mma_kernel) on the same inputs, version 2 also
// against version 1, and version 3 (the decode overlapping the MMAs) must give version 2's bits; version 4 (warp-
// specialised, its own summation order) within bf16 of the CPU and of version 2, version 5 (version 4 on keys decoded
// once a launch) version 4's bits. Then the
// op's choice: a 600-query chunk takes the selected prefill kernel (its bits), and under --batch-invariant or
// set_attention_prefill(false) the decode kernel's bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/attention.cuh"
#include "backends/cuda/kernels/wgmma_probe.cuh"
#include "gpu_test_util.h"
#include "ops/attention.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/rope.h"
#include "core/dtype.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

// One chunk of one sequence: its queries, rows, ring, compressed rows (in shuffled pages) and picks, on the
// host (the CPU reference reads them) and on the device.
struct Chunk {
  ops::KvRowFormat fmt;
  int64_t heads = 0, window = 0, start = 0, n = 0, num_c = 0;
  int ratio = 0;
  bool select = false;
  Tensor q, rows, ring, comp, sel, sinks;
  PagedPair paged;
  cuda::DeviceTensor dq, drows, dring, dsel, dsinks;
  float scale = 1.0f;

  ops::AttentionArgs host_args() const {
    return ops::AttentionArgs{q,
                              start,
                              fmt,
                              rows,
                              ring,
                              window,
                              ratio > 0 ? paged.host : PagedRows(),
                              num_c,
                              ratio,
                              select ? sel.view() : TensorView(),
                              sinks,
                              scale};
  }
  ops::AttentionArgs device_args() const {
    return ops::AttentionArgs{dq,
                              start,
                              fmt,
                              drows,
                              dring,
                              window,
                              ratio > 0 ? paged.device : PagedRows(),
                              num_c,
                              ratio,
                              select ? dsel.view() : TensorView(),
                              dsinks,
                              scale};
  }
};

Tensor pack_rows(const ops::KvRowFormat& f, int64_t n, Rand& r) {
  Tensor x = random_f32({n, f.head_dim}, r), p(DType::u8, {n, f.row_bytes()});
  ops::kv_pack(cpu::context(), x, f, p);
  return p;
}

// CSA (select): `topk` picks per query among its visible compressed rows, some -1 among them (j % 7 == 3),
// every pick -1 for queries i % 11 == 5, and a -1 tail where fewer rows are visible than picks.
Chunk make_chunk(const Shapes& s, int ratio, bool select, int64_t start, int64_t n, Rand& r) {
  Chunk c;
  c.fmt = ops::KvRowFormat{ops::KvFormat::fp8_ds, s.head_dim, s.rope_dim};
  c.heads = s.heads;
  c.window = s.window;
  c.start = start;
  c.n = n;
  c.ratio = ratio;
  c.select = select;
  c.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  c.q = random_f32({n, s.heads, s.head_dim}, r, 0.5f);
  c.sinks = random_f32({s.heads}, r);
  c.rows = pack_rows(c.fmt, n, r);
  c.ring = pack_rows(c.fmt, s.window, r);  // position p < start at p % window
  c.num_c = ratio > 0 ? (start + n) / ratio : 0;
  c.comp = pack_rows(c.fmt, std::max<int64_t>(c.num_c, 1), r);
  c.paged = paged_pair(c.comp, 64, r);
  if (select) {
    const int64_t k = s.index_topk;
    c.sel = Tensor(DType::i32, {n, k});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t vis = (start + i + 1) / ratio;
      std::vector<int32_t> all(static_cast<size_t>(vis));
      std::iota(all.begin(), all.end(), 0);
      for (int64_t j = 0; j < k; ++j) {
        if (j < vis) std::swap(all[j], all[j + r.index(vis - j)]);
        const bool keep = j < vis && j % 7 != 3 && i % 11 != 5;
        c.sel.data<int32_t>()[i * k + j] = keep ? all[j] : -1;
      }
    }
    c.dsel = upload(c.sel);
  }
  c.dq = upload(c.q);
  c.drows = upload(c.rows);
  c.dring = upload(c.ring);
  c.dsinks = upload(c.sinks);
  return c;
}

// The launch parameters of the chunk (as CudaBackend::sparse_attention fills them), error word `err`.
cuda::AttentionParams params_of(const Chunk& c, float* out, int* err) {
  cuda::AttentionParams p;
  p.q = c.dq.view().data_as<const float>();
  p.n = c.n;
  p.heads = c.heads;
  p.start = c.start;
  p.fmt = cuda::KvRowDesc{1, c.fmt.head_dim, c.fmt.rope_dim, c.fmt.row_bytes()};
  p.chunk_rows = c.drows.view().data_as<const uint8_t>();
  p.ring = c.dring.view().data_as<const uint8_t>();
  p.window = c.window;
  if (c.ratio > 0 && c.num_c > 0) {
    const PagedRows& d = c.paged.device;
    p.compressed = {d.pool.data_as<const uint8_t>(),
                    d.block_table.data_as<const int32_t>(),
                    d.page_bytes(),
                    d.offset_in_page,
                    d.rows_per_page,
                    d.row_bytes};
    p.num_compressed = c.num_c;
  }
  p.ratio = c.ratio;
  p.selected = c.select ? c.dsel.view().data_as<const int32_t>() : nullptr;
  p.k_sel = c.select ? c.sel.dim(1) : 0;
  p.sinks = c.dsinks.view().data_as<const float>();
  p.scale = c.scale;
  p.out = out;
  p.err = err;
  return p;
}

enum class Kernel { prefill, prefill_wgmma, prefill_wgmma_overlap, prefill_ws, prefill_pre, decode };

// One direct launch of a tensor-core kernel on the chunk; the device error word must stay 0.
Tensor run_kernel(const Chunk& c, Kernel k) {
  cuda::CudaBackend& be = cuda::register_backend();
  auto out = poisoned(DType::f32, {c.n, c.heads, c.fmt.head_dim});
  cuda::DeviceTensor err(DType::i32, {1});
  cuda::fill_bytes(err.view(), 0);
  cuda::AttentionParams p = params_of(c, out.view().data_as<float>(), err.view().data_as<int>());
  // Version 5's workspace (the bf16 copy of the key rows), poisoned so that a row it fails to write shows.
  cuda::DeviceTensor kv(DType::u8, {k == Kernel::prefill_pre ? cuda::attention_prefill_kv_bytes(p) : 1});
  cuda::fill_bytes(kv.view(), 0xff);
  if (k == Kernel::prefill_pre) p.partial = kv.view().data_as<float>();
  const auto stream = static_cast<cudaStream_t>(be.stream());
  const cudaError_t e = k == Kernel::prefill         ? cuda::launch_attention_prefill_v1(p, stream)
                        : k == Kernel::prefill_wgmma ? cuda::launch_attention_prefill_wgmma(p, stream, false)
                        : k == Kernel::prefill_wgmma_overlap
                            ? cuda::launch_attention_prefill_wgmma(p, stream, true)
                        : k == Kernel::prefill_ws  ? cuda::launch_attention_prefill_ws(p, stream)
                        : k == Kernel::prefill_pre ? cuda::launch_attention_prefill_pre(p, stream)
                                                   : cuda::launch_attention_mma(p, stream);
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  be.synchronize();
  const Tensor e_host = cuda::to_host(err);
  EXPECT_EQ(e_host.data<int32_t>()[0], 0) << "device error word set";
  return cuda::to_host(out);
}

struct Case {
  const char* name;
  bool csa;         // CSA (ratio csa_ratio, top-k picks) or HCA (ratio hca_ratio, every compressed row)
  int64_t start_w;  // start = start_w * window + 5: queries below i = window - 1 see the ring
};

class GpuAttentionPrefill : public ::testing::TestWithParam<Shapes> {};

TEST_P(GpuAttentionPrefill, MatchesCpuAndDecodeKernel) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const ops::KvRowFormat f{ops::KvFormat::fp8_ds, s.head_dim, s.rope_dim};
  ASSERT_TRUE(attention_on_tensor_cores(f, s.heads)) << "the tensor-core paths do not take this shape";
  // V4 CSA at start 40 * 128 + 5 sees ~1280 compressed rows (512 picks); at start 2 * 128 + 5 only 65..215
  // (a -1 tail). HCA at 40 * 128 + 5 sees 40..44 rows; at 0 * 128 + 5 none for the first queries.
  const Case cases[] = {
      {"csa", true, 40}, {"csa short", true, 2}, {"hca", false, 40}, {"hca first rows", false, 0}};
  for (const Case& cs : cases)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{600}}) {
      if (cs.start_w < 40 && n != 64) continue;  // the edge chunks once
      const int ratio = static_cast<int>(cs.csa ? s.csa_ratio : s.hca_ratio);
      const Chunk c = make_chunk(s, ratio, cs.csa, cs.start_w * s.window + 5, n, r);
      Tensor ref(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cpu::context(), c.host_args(), ref);
      const Tensor mine = run_kernel(c, Kernel::prefill), old = run_kernel(c, Kernel::decode);
      const Tensor wg = run_kernel(c, Kernel::prefill_wgmma);
      const std::string what = cat(s.name, " ", cs.name, " n=", n);
      expect_close(upload(mine), ref, kTolBf16, cat("prefill kernel vs cpu, ", what));
      expect_close(upload(old), ref, kTolBf16, cat("decode kernel vs cpu, ", what));
      expect_close(upload(mine), old, kTolBf16, cat("prefill kernel vs decode kernel, ", what));
      expect_close(upload(wg), ref, kTolBf16, cat("prefill wgmma kernel vs cpu, ", what));
      expect_close(upload(wg), mine, kTolBf16, cat("prefill wgmma kernel vs prefill kernel, ", what));
      const Tensor wg3 = run_kernel(c, Kernel::prefill_wgmma_overlap);
      EXPECT_EQ(std::memcmp(wg3.data<float>(), wg.data<float>(), wg.nbytes()), 0)
          << "version 3 (overlapped decode) is not version 2's bits, " << what;
      if (std::memcmp(wg3.data<float>(), wg.data<float>(), wg.nbytes()) != 0)
        expect_close(upload(wg3), ref, kTolBf16,
                     cat("prefill wgmma kernel, overlapped decode, vs cpu, ", what));
      // Version 4 (warp-specialised): its own summation order, so within bf16 of the CPU and of version 2.
      const Tensor ws = run_kernel(c, Kernel::prefill_ws);
      expect_close(upload(ws), ref, kTolBf16, cat("prefill ws kernel vs cpu, ", what));
      expect_close(upload(ws), wg, kTolBf16, cat("prefill ws kernel vs prefill wgmma kernel, ", what));
      // Version 5 (the keys decoded once a launch): the same bf16 tiles in the same order, so version 4's bits.
      const Tensor pre = run_kernel(c, Kernel::prefill_pre);
      EXPECT_EQ(std::memcmp(pre.data<float>(), ws.data<float>(), ws.nbytes()), 0)
          << "version 5 (keys decoded once) is not version 4's bits, " << what;
      if (std::memcmp(pre.data<float>(), ws.data<float>(), ws.nbytes()) != 0)
        expect_close(upload(pre), ref, kTolBf16, cat("prefill ws kernel on decoded keys vs cpu, ", what));
    }
  cuda::register_backend().check_device_errors();
}

// The op's choice of kernel: the selected prefill kernel (version 5 by default, 1-4 as
// TERN_ATTENTION_PREFILL=1-4) for a chunk that takes the library GEMMs, the decode kernel under
// --batch-invariant and under set_attention_prefill(false) (TERN_ATTENTION_PREFILL=0), each recognised by its
// exact bits; decode mode never takes a prefill kernel.
TEST_P(GpuAttentionPrefill, OpTakesPrefillKernelOnlyForLibraryChunks) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  const bool saved_bi = be.batch_invariant();
  const int saved_version = cuda::attention_prefill_version();
  const int64_t n = cuda::CudaBackend::library_min_tokens() + 88;
  // HCA at 100 windows in: over 200 keys a query, so the decode kernel cuts each query in 2 or more splits
  // and its bits differ from the prefill kernel's (with one split they are the same arithmetic).
  const Chunk c = make_chunk(s, static_cast<int>(s.hca_ratio), false, 100 * s.window + 5, n, r);
  const Tensor mine = run_kernel(c, Kernel::prefill), old = run_kernel(c, Kernel::decode);
  const Tensor wg = run_kernel(c, Kernel::prefill_wgmma), ws = run_kernel(c, Kernel::prefill_ws);
  ASSERT_NE(std::memcmp(mine.data<float>(), old.data<float>(), mine.nbytes()), 0)
      << "the two kernels gave the same bits: this test cannot tell which one the op ran";
  auto op = [&] {
    auto out = poisoned(DType::f32, {n, s.heads, s.head_dim});
    ops::sparse_attention(cuda::context(), c.device_args(), out);
    return cuda::to_host(out);
  };
  cuda::AttentionParams p = params_of(c, nullptr, nullptr);
  // The decode kernel's path: attention_mma_kernel, or attention_heads_kernel (the same bits) when
  // TERN_ATTENTION_DECODE selects it and the rows are its format.
  const cuda::AttentionPath decode =
      cuda::attention_decode() != cuda::AttentionDecode::cluster && cuda::attention_heads_supported(p.fmt, p.heads)
          ? cuda::AttentionPath::bf16_tensor_cores_heads
          : cuda::AttentionPath::bf16_tensor_cores;
  struct Mode {
    const char* name;
    bool batch_invariant;
    int version;
    const Tensor* expect;
    cuda::AttentionPath path;
  };
  const Mode modes[] = {
      {"TERN_ATTENTION_PREFILL=1", false, 1, &mine, cuda::AttentionPath::bf16_tensor_cores_prefill},
      {"TERN_ATTENTION_PREFILL=2", false, 2, &wg, cuda::AttentionPath::bf16_tensor_cores_prefill},
      {"TERN_ATTENTION_PREFILL=3", false, 3, &wg, cuda::AttentionPath::bf16_tensor_cores_prefill},
      {"TERN_ATTENTION_PREFILL=4", false, 4, &ws, cuda::AttentionPath::bf16_tensor_cores_prefill},
      {"TERN_ATTENTION_PREFILL=5", false, 5, &ws, cuda::AttentionPath::bf16_tensor_cores_prefill},
      {"--batch-invariant", true, 1, &old, decode},
      {"--batch-invariant, version 2", true, 2, &old, decode},
      {"TERN_ATTENTION_PREFILL=0", false, 0, &old, decode}};
  for (const Mode& m : modes) {
    be.set_batch_invariant(m.batch_invariant);
    cuda::set_attention_prefill_version(m.version);
    p.prefill = !m.batch_invariant;  // what CudaBackend::sparse_attention sets at this n
    EXPECT_EQ(cuda::attention_path(p), m.path) << m.name;
    std::printf("  %-26s %s\n", m.name, cuda::attention_path_name(cuda::attention_path(p)));
    const Tensor got = op();
    EXPECT_EQ(std::memcmp(got.data<float>(), m.expect->data<float>(), got.nbytes()), 0)
        << m.name << ": the op's bits are not the expected kernel's";
  }
  // Decode mode never takes the prefill kernel.
  p.prefill = true;
  const int64_t position = c.start;
  p.positions = &position;  // only compared with null by attention_path
  for (const int version : {1, 2, 3, 4, 5}) {
    cuda::set_attention_prefill_version(version);
    EXPECT_EQ(cuda::attention_path(p), decode) << "version " << version;
  }
  be.set_batch_invariant(saved_bi);
  cuda::set_attention_prefill(true);  // the default: version 5 (measured fastest, session 34)
  EXPECT_EQ(cuda::attention_prefill_version(), 5);
  cuda::set_attention_prefill_version(saved_version);
  be.check_device_errors();
}

// The output rotated back and quantised for wo_a (sparse_attention into ops::Fp8Rows, AttentionArgs::out_inv_freq): in
// the wgmma prefill kernels' epilogue (versions 2 and 3) for a chunk that takes them, by rope_kernel and act_quant
// after the op otherwise (version 1, a short chunk). Every way the bytes and scales of the f32 op, then ops::rope
// (inverse), then ops::act_quant; and the f32 op with out_inv_freq the bits of the f32 op then ops::rope. Against the
// CPU's FP8 rows: their dequantised values within e4m3's rounding of the bf16 products' differences.
TEST_P(GpuAttentionPrefill, OpRotatesAndQuantisesItsOutput) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int saved_version = cuda::attention_prefill_version();
  const int64_t half = s.rope_dim / 2, width = s.heads * s.head_dim;
  if (width % 128 != 0) GTEST_SKIP() << "heads x head_dim " << width << " is not a multiple of 128";
  Tensor inv_freq(DType::f32, {half});
  for (int64_t j = 0; j < half; ++j)
    inv_freq.data<float>()[j] = std::pow(10000.0f, -2.0f * static_cast<float>(j) / static_cast<float>(s.rope_dim));
  const auto dinv = upload(inv_freq);
  for (const int64_t n : {int64_t{64}, cuda::CudaBackend::library_min_tokens() + 89}) {
    const Chunk c = make_chunk(s, static_cast<int>(s.csa_ratio), true, 40 * s.window + 5, n, r);
    Tensor pos(DType::i64, {n});
    for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = c.start + i;
    const auto dpos = upload(pos);
    const int64_t P = ops::Fp8Rows::padded_rows(n);
    ops::AttentionArgs dev = c.device_args(), host = c.host_args();
    dev.positions = dpos, dev.out_inv_freq = dinv;
    host.positions = pos, host.out_inv_freq = inv_freq;
    Tensor hv(DType::u8, {P, width}), hs(DType::f32, {width / 128, P});
    ops::sparse_attention(cpu::context(), host, ops::Fp8Rows{hv, hs, n});
    for (const int version : {5, 4, 3, 2, 1}) {
      cuda::set_attention_prefill_version(version);
      const std::string what = cat(s.name, " n=", n, " prefill version ", version);
      // The pieces: the f32 op, rope_kernel, act_quant.
      auto plain = poisoned(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cuda::context(), c.device_args(), plain);
      ops::rope(cuda::context(), plain, dpos, dinv, /*inverse=*/true);
      auto wv = poisoned(DType::u8, {P, width}), ws = poisoned(DType::f32, {width / 128, P});
      ops::act_quant(cuda::context(), plain.view().reshape({n, width}), ops::Fp8Rows{wv, ws, n});
      // The op.
      auto gv = poisoned(DType::u8, {P, width}), gs = poisoned(DType::f32, {width / 128, P});
      ops::sparse_attention(cuda::context(), dev, ops::Fp8Rows{gv, gs, n});
      auto rotated = poisoned(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cuda::context(), dev, rotated);
      const Tensor a = cuda::to_host(wv), b = cuda::to_host(gv), as = cuda::to_host(ws), bs = cuda::to_host(gs);
      EXPECT_EQ(std::memcmp(a.data<uint8_t>(), b.data<uint8_t>(), static_cast<size_t>(n * width)), 0)
          << what << ": the op's FP8 bytes are not the pieces'";
      for (int64_t blk = 0; blk < width / 128; ++blk)
        ASSERT_EQ(std::memcmp(as.data<float>() + blk * P, bs.data<float>() + blk * P, static_cast<size_t>(n) * 4), 0)
            << what << ": the scales of block " << blk << " are not the pieces'";
      const Tensor pr = cuda::to_host(plain), ro = cuda::to_host(rotated);
      EXPECT_EQ(std::memcmp(pr.data<float>(), ro.data<float>(), pr.nbytes()), 0)
          << what << ": the op rotating its output is not the op then rope";
      // Against the CPU, dequantised (e4m3 keeps 4 significant bits: inputs that differ by the bf16 products'
      // ~1e-3 round to neighbouring values in a few per cent of the elements).
      Tensor gd(DType::f32, {n, width}), cd(DType::f32, {n, width});
      for (int64_t i = 0; i < n; ++i)
        for (int64_t col = 0; col < width; ++col) {
          gd.data<float>()[i * width + col] = e4m3_to_f32(b.data<uint8_t>()[i * width + col]) * bs.data<float>()[(col / 128) * P + i];
          cd.data<float>()[i * width + col] = e4m3_to_f32(hv.data<uint8_t>()[i * width + col]) * hs.data<float>()[(col / 128) * P + i];
        }
      expect_close(upload(gd), cd, 3e-2, cat("FP8 rows vs cpu, ", what));
      if (n < cuda::CudaBackend::library_min_tokens()) break;  // the decode kernel: one version is enough
    }
  }
  cuda::set_attention_prefill_version(saved_version);
  cuda::register_backend().check_device_errors();
}

// q as wq_b wrote it (AttentionArgs::q_inv_freq): the op norms each head and rotates its rope dims itself, in the
// prefill kernels' q load for a chunk that takes them (every version), by norm_rope before the decode kernel for a
// short one. Either way the bits of ops::norm_rope on the GPU then the op on the normed q, and within bf16 of the
// CPU (which norms first too). q is drawn at 3x the normed scale, so a missing norm cannot pass.
TEST_P(GpuAttentionPrefill, OpNormsAndRotatesQ) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int saved_version = cuda::attention_prefill_version();
  const int64_t half = s.rope_dim / 2;
  Tensor inv_freq(DType::f32, {half});
  for (int64_t j = 0; j < half; ++j)
    inv_freq.data<float>()[j] = std::pow(10000.0f, -2.0f * static_cast<float>(j) / static_cast<float>(s.rope_dim));
  const auto dinv = upload(inv_freq);
  const float eps = 1e-6f;
  for (const int64_t n : {int64_t{64}, cuda::CudaBackend::library_min_tokens() + 88}) {
    Chunk c = make_chunk(s, static_cast<int>(s.csa_ratio), true, 40 * s.window + 5, n, r);
    c.q = random_f32({n, s.heads, s.head_dim}, r, 3.0f);
    c.dq = upload(c.q);
    Tensor pos(DType::i64, {n});
    for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = c.start + i;
    const auto dpos = upload(pos);
    ops::AttentionArgs host = c.host_args(), dev = c.device_args();
    host.positions = pos, host.q_inv_freq = inv_freq, host.q_norm_eps = eps;
    dev.positions = dpos, dev.q_inv_freq = dinv, dev.q_norm_eps = eps;
    Tensor ref(DType::f32, {n, s.heads, s.head_dim});
    ops::sparse_attention(cpu::context(), host, ref);
    for (const int version : {1, 2, 3, 4, 5}) {
      cuda::set_attention_prefill_version(version);
      const std::string what = cat(s.name, " n=", n, " prefill version ", version);
      auto got = poisoned(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cuda::context(), dev, got);
      // The same on a q normed by the op of its own.
      auto normed = poisoned(DType::f32, {n, s.heads, s.head_dim}), want = poisoned(DType::f32, {n, s.heads, s.head_dim});
      ops::norm_rope(cuda::context(), c.dq, {}, eps, dpos, dinv, normed);
      ops::AttentionArgs plain = c.device_args();
      plain.q = normed;
      ops::sparse_attention(cuda::context(), plain, want);
      const Tensor g = cuda::to_host(got), w = cuda::to_host(want);
      EXPECT_EQ(std::memcmp(g.data<float>(), w.data<float>(), g.nbytes()), 0)
          << what << ": q normed in the op is not norm_rope then the op";
      expect_close(got, ref, kTolBf16, cat("q normed in the op vs cpu, ", what));
      if (n < cuda::CudaBackend::library_min_tokens()) break;  // the decode kernel: one version is enough
    }
  }
  cuda::set_attention_prefill_version(saved_version);
  cuda::register_backend().check_device_errors();
}

// The wgmma layouts of versions 2 / 3 on their own (wgmma_probe.cu: the kernel's S and P V steps on two known
// matrices), so that a descriptor or fragment error shows here as a wrong product, not only as an attention
// mismatch. CPU: the operands rounded to bf16 (nearest even), products in double; P V takes the GPU's S
// (rounded to bf16) as its P, so it checks the P V step alone.
TEST(GpuWgmmaProbe, MatchesCpuProducts) {
  TERN_REQUIRE_GPU();
  constexpr int64_t kD = 512;
  Rand r(fresh_seed());
  const Tensor a = random_f32({64, kD}, r), b = random_f32({64, kD}, r);
  const cuda::DeviceTensor da = upload(a), db = upload(b);
  auto ds = poisoned(DType::f32, {64, 64});
  auto dout = poisoned(DType::f32, {64, kD});
  cuda::CudaBackend& be = cuda::register_backend();
  const cudaError_t e = cuda::launch_wgmma_probe(
      da.view().data_as<const float>(), db.view().data_as<const float>(), ds.view().data_as<float>(),
      dout.view().data_as<float>(), static_cast<cudaStream_t>(be.stream()));
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  be.synchronize();
  const Tensor s = cuda::to_host(ds), o = cuda::to_host(dout);
  auto bf16 = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float y;
    std::memcpy(&y, &u, 4);
    return static_cast<double>(y);
  };
  const float *pa = a.data<float>(), *pb = b.data<float>(), *ps = s.data<float>(), *po = o.data<float>();
  double s_err = 0, s_max = 0, o_err = 0, o_max = 0;
  int s_bad = -1, o_bad = -1;
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t j = 0; j < 64; ++j) {
      double ref = 0;
      for (int64_t k = 0; k < kD; ++k) ref += bf16(pa[i * kD + k]) * bf16(pb[j * kD + k]);
      const double err = std::fabs(ref - ps[i * 64 + j]);
      if (!(err <= s_err)) s_bad = static_cast<int>(i * 64 + j);
      s_err = std::isnan(err) ? INFINITY : std::max(s_err, err);
      s_max = std::max(s_max, std::fabs(ref));
    }
  for (int64_t i = 0; i < 64; ++i)
    for (int64_t d = 0; d < kD; ++d) {
      double ref = 0;
      for (int64_t j = 0; j < 64; ++j) ref += bf16(ps[i * 64 + j]) * bf16(pb[j * kD + d]);
      const double err = std::fabs(ref - po[i * kD + d]);
      if (!(err <= o_err)) o_bad = static_cast<int>(i * kD + d);
      o_err = std::isnan(err) ? INFINITY : std::max(o_err, err);
      o_max = std::max(o_max, std::fabs(ref));
    }
  EXPECT_LE(s_err, 1e-3 * s_max) << "S = Q K^T (both operands K-major, 128-byte swizzle): worst at row "
                                 << s_bad / 64 << " col " << s_bad % 64;
  EXPECT_LE(o_err, 1e-3 * o_max) << "O = P V (P from the S accumulators, V MN-major): worst at row "
                                 << o_bad / kD << " dim " << o_bad % kD;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttentionPrefill, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
