// GPU vs CPU: sparse attention at the real V4-Flash decode shapes (64 heads, 512-d K=V rows of 448 FP8 +
// 64 bf16 dims, window 128): CSA (128 window + 512 picked compressed rows) and HCA (128 + up to 64
// compressed rows) through step_attention at batch 1, 16, 64 and 128. Every slot has its own
// position, ring, compressed pages and picks; each is checked against the CPU's eager op over the same rows.
// Batch invariance: a slot alone gives the same bits as inside a batch of 64 (with inert padding slots)
// and as the eager op on the same query. The CPU backend's batched op (host address tables) runs the same
// batches: its slots are the CPU eager op's bits, and the GPU launch is checked against it too.
// The decode kernels (TERN_ATTENTION_DECODE, cuda::set_attention_decode): attention_heads_kernel at 16 and 32
// heads a block and by launch size gives attention_mma_kernel's bits at every batch, also at context ~1K (the
// decode profile's: CSA with fewer visible rows than picks, HCA with 7-8 compressed rows), is batch invariant
// on its own, and replays from a CUDA graph with the eager launch's bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/attention.cuh"
#include "gpu_test_util.h"
#include "ops/attention.h"
#include "ops/step.h"
#include "ops/kv_row.h"

namespace tern::gputest {
namespace {

constexpr int64_t kH = 64, kHd = 512, kRope = 64, kW = 128, kTopk = 512, kRowsPerPage = 64;
const ops::KvRowFormat kFmt{ops::KvFormat::fp8_ds, kHd, kRope};

Tensor packed_rows(int64_t n, Rand& r) {
  Tensor x = random_f32({n, kHd}, r), p(DType::u8, {n, kFmt.row_bytes()});
  ops::kv_pack(cpu::context(), x, kFmt, p);
  return p;
}

// One decode slot: its query, new row, ring, compressed rows (in shuffled pages) and picks, on the host
// (the reference) and on the device.
struct Slot {
  int64_t position = 0, visible = 0;
  Tensor q, row, ring, sel;
  PagedPair comp;
  cuda::DeviceTensor dq, drow, dring, dsel;
};

Slot make_slot(int ratio, bool select, int64_t position, Rand& r) {
  Slot s;
  s.position = position;
  s.visible = (position + 1) / ratio;
  s.q = random_f32({1, kH, kHd}, r);
  s.row = packed_rows(1, r);
  s.ring = packed_rows(kW, r);
  s.comp = paged_pair(packed_rows(std::max<int64_t>(s.visible, 1), r), kRowsPerPage, r);
  if (select) {
    s.sel = Tensor(DType::i32, {1, kTopk});
    std::vector<int32_t> all(static_cast<size_t>(s.visible));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t j = 0; j < kTopk; ++j) {
      if (j < s.visible) std::swap(all[j], all[j + r.index(s.visible - j)]);
      s.sel.data<int32_t>()[j] = j < s.visible ? all[j] : -1;
    }
    if (position % 5 == 1)  // some slots with masked picks among the real ones
      for (int64_t j = 3; j < kTopk; j += 9) s.sel.data<int32_t>()[j] = -1;
    s.dsel = upload(s.sel);
  }
  s.dq = upload(s.q);
  s.drow = upload(s.row);
  s.dring = upload(s.ring);
  return s;
}

struct Case {
  const char* name;
  int ratio;
  bool select;
  int64_t base, step, spread;  // slot i at position base + (step * i) % spread (but see Attention)
};

class Attention {
 public:
  Attention(const Case& c, int64_t slots, Rand& r) : c_(c) {
    sinks_ = random_f32({kH}, r);
    dsinks_ = upload(sinks_);
    for (int64_t i = 0; i < slots; ++i) {
      // kCases: CSA positions near 2.2K (about 550 visible entries, 512 picked), HCA 40 .. 64 compressed rows;
      // kCases1K: about 1K (CSA 225 .. 287 visible entries, HCA 7 or 8). Every case: a few short ones (CSA: a
      // window shorter than 128; HCA: no compressed row yet).
      int64_t pos = c.base + (c.step * i) % c.spread;
      if (i % 23 == 7) pos = c.select ? 50 + i : 100;
      slots_.push_back(make_slot(c.ratio, c.select, pos, r));
    }
  }

  // The CPU's eager op for one slot (a one-token chunk at its position).
  Tensor reference(int64_t i) const {
    const Slot& s = slots_[i];
    ops::AttentionArgs a{s.q, s.position, kFmt, s.row, s.ring, kW, s.comp.host, s.visible, c_.ratio,
                         c_.select ? s.sel.view() : TensorView(), sinks_, scale()};
    Tensor ref(DType::f32, {1, kH, kHd});
    ops::sparse_attention(cpu::context(), a, ref);
    return ref;
  }

  // The CUDA eager op for one slot.
  Tensor eager(int64_t i) const {
    const Slot& s = slots_[i];
    ops::AttentionArgs a{s.dq, s.position, kFmt, s.drow, s.dring, kW, s.comp.device, s.visible, c_.ratio,
                         c_.select ? s.dsel.view() : TensorView(), dsinks_, scale()};
    auto out = poisoned(DType::f32, {1, kH, kHd});
    ops::sparse_attention(cuda::context(), a, out);
    return cuda::to_host(out);
  }

  // One decode launch over `which` (slot indices; -1 an inert padding slot), its device inputs uploaded and
  // its output poisoned: prepare() allocates (so it stays outside a graph capture), launch() only launches.
  struct Launch {
    ops::StepAttentionArgs args;
    std::vector<cuda::DeviceTensor> inputs;
    cuda::DeviceTensor out;
    void run() const { ops::step_attention(cuda::context(), args, out); }
  };
  Launch prepare(const std::vector<int64_t>& which) const {
    const Batch t = batch(which, /*host=*/false);
    Launch l;
    for (const Tensor* x : {&t.q, &t.rows, &t.pos, &t.rings, &t.pools, &t.tables, &t.sel}) l.inputs.push_back(upload(*x));
    ops::StepAttentionArgs& a = l.args;
    a = args(t, slots_[0].comp.device);
    a.q = l.inputs[0];
    a.rows = l.inputs[1];
    a.positions = l.inputs[2];
    a.rings = l.inputs[3];
    a.compressed.pools = l.inputs[4];
    a.compressed.tables = l.inputs[5];
    if (c_.select) a.selected = l.inputs[6];
    a.sinks = dsinks_;
    l.out = poisoned(DType::f32, {t.size, kH, kHd});
    return l;
  }

  // One decode launch over `which`. Returns the device output.
  cuda::DeviceTensor decode(const std::vector<int64_t>& which) const {
    Launch l = prepare(which);
    l.run();
    dev_ = std::move(l.inputs);  // kept until the next launch (the stream may still read them)
    return std::move(l.out);
  }

  // The same batch through the CPU backend's batched op (host address tables).
  Tensor decode_cpu(const std::vector<int64_t>& which) const {
    const Batch t = batch(which, /*host=*/true);
    ops::StepAttentionArgs a = args(t, slots_[0].comp.host);
    a.sinks = sinks_;
    Tensor out(DType::f32, {t.size, kH, kHd});
    ops::step_attention(cpu::context(), a, out);
    return out;
  }

  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }

 private:
  static float scale() { return 1.0f / std::sqrt(static_cast<float>(kHd)); }

  // The host arrays of one decode batch; the state addresses are the host copies' or the device's.
  struct Batch {
    int64_t size = 0, max_comp = 0;
    Tensor q, rows, pos, rings, pools, tables, sel;
  };
  Batch batch(const std::vector<int64_t>& which, bool host) const {
    const int64_t B = static_cast<int64_t>(which.size()), rb = kFmt.row_bytes();
    Batch t;
    t.size = B;
    t.q = Tensor(DType::f32, {B, kH, kHd}), t.rows = Tensor(DType::u8, {B, rb}), t.pos = Tensor(DType::i64, {B});
    t.rings = Tensor(DType::i64, {B}), t.pools = Tensor(DType::i64, {B}), t.tables = Tensor(DType::i64, {B});
    t.sel = Tensor(DType::i32, {B, kTopk});
    Rand noise(99);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t i = which[b];
      float* qd = t.q.data<float>() + b * kH * kHd;
      if (i < 0) {  // inert: nothing of it may be read (its q and row are noise, its addresses 0)
        for (int64_t k = 0; k < kH * kHd; ++k) qd[k] = noise.fast();
        std::memset(t.rows.data<uint8_t>() + b * rb, 0x7f, rb);
        t.pos.data<int64_t>()[b] = -1;
        t.rings.data<int64_t>()[b] = t.pools.data<int64_t>()[b] = t.tables.data<int64_t>()[b] = 0;
        std::fill_n(t.sel.data<int32_t>() + b * kTopk, kTopk, 1 << 30);
        continue;
      }
      const Slot& s = slots_[i];
      const PagedRows& comp = host ? s.comp.host : s.comp.device;
      std::memcpy(qd, s.q.data<float>(), kH * kHd * sizeof(float));
      std::memcpy(t.rows.data<uint8_t>() + b * rb, s.row.data<uint8_t>(), rb);
      t.pos.data<int64_t>()[b] = s.position;
      t.rings.data<int64_t>()[b] = reinterpret_cast<int64_t>(host ? s.ring.view().data() : s.dring.view().data());
      t.pools.data<int64_t>()[b] = reinterpret_cast<int64_t>(comp.pool.data());
      t.tables.data<int64_t>()[b] = reinterpret_cast<int64_t>(comp.block_table.data());
      if (c_.select) std::memcpy(t.sel.data<int32_t>() + b * kTopk, s.sel.data<int32_t>(), kTopk * sizeof(int32_t));
      t.max_comp = std::max(t.max_comp, s.visible);
    }
    return t;
  }
  // Arguments over the host arrays of `t` (the caller swaps in device copies for the GPU).
  ops::StepAttentionArgs args(const Batch& t, const PagedRows& geo) const {
    ops::StepAttentionArgs a;
    a.q = t.q;
    a.rows = t.rows;
    a.positions = t.pos;
    a.rings = t.rings;
    a.compressed = {t.pools, t.tables, geo.page_bytes(), geo.offset_in_page, geo.rows_per_page, geo.row_bytes};
    a.format = kFmt;
    a.window = kW;
    a.ratio = c_.ratio;
    a.max_compressed = std::max<int64_t>(t.max_comp, 1);
    if (c_.select) a.selected = t.sel;
    a.scale = scale();
    return a;
  }
  Case c_;
  Tensor sinks_;
  cuda::DeviceTensor dsinks_;
  std::vector<Slot> slots_;
  mutable std::vector<cuda::DeviceTensor> dev_;
};

const Case kCases[] = {{"csa", 4, true, 2200, 37, 800}, {"hca", 128, false, 40 * 128, 211, 24 * 128}};
const Case kCases1K[] = {{"csa 1K", 4, true, 900, 37, 250}, {"hca 1K", 128, false, 900, 37, 250}};

// Sets the decode kernel (TERN_ATTENTION_DECODE) for a scope, then restores it.
class DecodeKernel {
 public:
  explicit DecodeKernel(cuda::AttentionDecode d) : saved_(cuda::attention_decode()) { cuda::set_attention_decode(d); }
  ~DecodeKernel() { cuda::set_attention_decode(saved_); }
  DecodeKernel(const DecodeKernel&) = delete;
  DecodeKernel& operator=(const DecodeKernel&) = delete;

 private:
  cuda::AttentionDecode saved_;
};

// The path the op takes for a V4-Flash decode launch under the current selection.
cuda::AttentionPath decode_path() {
  cuda::AttentionParams p;
  p.heads = kH;
  p.fmt = {1, kHd, kRope, kFmt.row_bytes()};
  const int64_t position = 0;
  p.positions = &position;  // only compared with null by attention_path
  return cuda::attention_path(p);
}

// 32-bit words of two host f32 tensors of the same size that differ.
int64_t words_differing(const Tensor& a, const Tensor& b) {
  int64_t d = 0;
  for (int64_t k = 0; k < a.numel(); ++k) d += std::memcmp(a.data<float>() + k, b.data<float>() + k, 4) != 0;
  return d;
}

// Row b of a host [B, H, hd] tensor as [1, H, hd].
Tensor row_of(const Tensor& all, int64_t b) {
  Tensor one(DType::f32, {1, kH, kHd});
  std::memcpy(one.data<float>(), all.data<float>() + b * kH * kHd, kH * kHd * sizeof(float));
  return one;
}

TEST(GpuAttention, DecodeV4Shapes) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const double tol = attention_on_tensor_cores(kFmt, kH) ? kTolBf16 : kTolF32;
  std::printf("  attention path: %s\n", attention_on_tensor_cores(kFmt, kH) ? "bf16 tensor cores" : "f32 CUDA cores");
  for (const Case& c : kCases) {
    const Attention att(c, 128, r);
    std::vector<Tensor> refs;
    for (int64_t i = 0; i < att.slots(); ++i) refs.push_back(att.reference(i));
    for (int64_t B : {1, 16, 64, 128}) {
      std::vector<int64_t> which(static_cast<size_t>(B));
      std::iota(which.begin(), which.end(), 0);
      const cuda::DeviceTensor out = att.decode(which);
      Tensor ref(DType::f32, {B, kH, kHd});
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(ref.data<float>() + b * kH * kHd, refs[b].data<float>(), kH * kHd * sizeof(float));
      expect_close(out, ref, tol, cat("step_attention ", c.name, " batch ", B));
      // The CPU backend's batched op (the reference of this launch) gives the eager op's bits per slot.
      const Tensor cpu = att.decode_cpu(which);
      EXPECT_EQ(std::memcmp(cpu.data<float>(), ref.data<float>(), ref.nbytes()), 0)
          << "cpu step_attention " << c.name << " batch " << B << " differs from the eager op";
      expect_close(out, cpu, tol, cat("step_attention vs cpu step_attention ", c.name, " batch ", B));
    }
  }
  cuda::register_backend().check_device_errors();
}

// Sequences of q = 1..4 queries (a verify step) in one decode launch with `firsts`, at V4-Flash's shapes (64 heads
// of 512, FP8 rows, window 128; CSA with 512 picks, HCA): each sequence's queries read its earlier rows of the step
// (chunk_rows) and its ring, as the CPU's eager op on the chunk does.
TEST(GpuAttention, DecodeSequencesOfSeveralQueries) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const double tol = attention_on_tensor_cores(kFmt, kH) ? kTolBf16 : kTolF32;
  for (const Case& c : kCases) {
    const int64_t seqs = 9;
    std::vector<int64_t> qs, starts;
    int64_t S = 0;
    for (int64_t k = 0; k < seqs; ++k) {
      qs.push_back(1 + k % 4);
      starts.push_back(k == 4 ? 2 : c.base + (c.step * k) % c.spread);  // one sequence at its very start
      S += qs.back();
    }
    Tensor q = random_f32({S, kH, kHd}, r), rows = packed_rows(S, r), sinks = random_f32({kH}, r);
    Tensor sel(DType::i32, {S, kTopk}), ref(DType::f32, {S, kH, kHd});
    std::vector<Tensor> rings;
    std::vector<PagedPair> comps;
    std::vector<int64_t> pos(S), firsts(S), ring_addr(S), pool_addr(S), table_addr(S);
    int64_t max_visible = 0;
    for (int64_t k = 0, i0 = 0; k < seqs; i0 += qs[k], ++k) {
      const int64_t n = qs[k], P = starts[k], visible = (P + n) / c.ratio;
      max_visible = std::max(max_visible, visible);
      rings.push_back(packed_rows(kW, r));
      comps.push_back(paged_pair(packed_rows(std::max<int64_t>(visible, 1), r), kRowsPerPage, r));
      for (int64_t t = 0; t < n; ++t) {  // each query's picks among the entries it sees
        const int64_t i = i0 + t, vis = (P + t + 1) / c.ratio;
        pos[i] = P + t, firsts[i] = i0;
        for (int64_t j = 0; j < kTopk; ++j)
          sel.data<int32_t>()[i * kTopk + j] = j < vis ? static_cast<int32_t>((j * 7 + t) % vis) : -1;
      }
      ops::AttentionArgs e{q.view().rows(i0, i0 + n), P, kFmt, rows.view().rows(i0, i0 + n), rings.back(), kW,
                           comps.back().host, visible, c.ratio, c.select ? sel.view().rows(i0, i0 + n) : TensorView(),
                           sinks, 1.0f / std::sqrt(static_cast<float>(kHd))};
      ops::sparse_attention(cpu::context(), e, ref.view().rows(i0, i0 + n));
    }
    std::vector<cuda::DeviceTensor> keep;
    for (int64_t k = 0, i0 = 0; k < seqs; i0 += qs[k], ++k) {
      keep.push_back(upload(rings[k]));
      for (int64_t t = 0; t < qs[k]; ++t) {
        ring_addr[i0 + t] = addr(keep.back());
        pool_addr[i0 + t] = addr(comps[k].device_pool);
        table_addr[i0 + t] = addr(comps[k].device_table);
      }
    }
    auto dq = upload(q), drows = upload(rows), dsel = upload(sel), dsinks = upload(sinks), dpos = upload(i64(pos)),
         dfirsts = upload(i64(firsts)), drings = upload(i64(ring_addr)), dpools = upload(i64(pool_addr)),
         dtables = upload(i64(table_addr));
    ops::StepAttentionArgs a;
    a.q = dq;
    a.positions = dpos;
    a.firsts = dfirsts;
    a.format = kFmt;
    a.rows = drows;
    a.rings = drings;
    a.window = kW;
    a.ratio = c.ratio;
    a.compressed = {dpools, dtables, comps[0].device.page_bytes(), comps[0].device.offset_in_page, kRowsPerPage,
                    kFmt.row_bytes()};
    a.max_compressed = max_visible;
    if (c.select) a.selected = dsel;
    a.sinks = dsinks;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
    auto out = poisoned(DType::f32, {S, kH, kHd});
    ops::step_attention(cuda::context(), a, out);
    expect_close(out, ref, tol, cat("step_attention with firsts ", c.name));
  }
  cuda::register_backend().check_device_errors();
}

// A slot alone, eagerly and inside a batch of 64 (60 slots and 4 inert ones) gives the same bits, for a sample of
// slots including the short ones; inert slots write zeros.
void check_batch_invariance(Rand& r) {
  for (const Case& c : kCases) {
    const Attention att(c, 60, r);
    // 64 slots: the 60 slots with 4 inert ones among them.
    std::vector<int64_t> which(60);
    std::iota(which.begin(), which.end(), 0);
    for (int64_t k : {0, 13, 40, 63}) which.insert(which.begin() + k, -1);
    const Tensor batch = cuda::to_host(att.decode(which));
    const Tensor cpu = att.decode_cpu(which);
    int64_t checked = 0, equal = 0;
    for (int64_t b = 0; b < 64; ++b) {
      const int64_t i = which[b];
      if (i < 0) {  // inert slots write zeros
        const float* z = batch.data<float>() + b * kH * kHd;
        EXPECT_TRUE(std::all_of(z, z + kH * kHd, [](float v) { return v == 0.0f; })) << c.name << " inert slot " << b;
        const float* zc = cpu.data<float>() + b * kH * kHd;
        EXPECT_TRUE(std::all_of(zc, zc + kH * kHd, [](float v) { return v == 0.0f; }))
            << c.name << " inert slot " << b << " (cpu)";
        continue;
      }
      if (i % 7 != 0 && i % 23 != 7) continue;  // a sample, including the short ones
      const Tensor alone = cuda::to_host(att.decode({i}));
      EXPECT_EQ(std::memcmp(cpu.data<float>() + b * kH * kHd, att.reference(i).data<float>(),
                            kH * kHd * sizeof(float)), 0)
          << c.name << ": slot " << i << " of the cpu batched op differs from the cpu eager op";
      const Tensor eager = att.eager(i);
      const Tensor mine = row_of(batch, b);
      const size_t bytes = kH * kHd * sizeof(float);
      const bool same = std::memcmp(alone.data<float>(), mine.data<float>(), bytes) == 0 &&
                        std::memcmp(eager.data<float>(), mine.data<float>(), bytes) == 0;
      EXPECT_TRUE(same) << c.name << ": slot " << i << " alone, eager and in a batch of 64 differ";
      ++checked;
      equal += same;
    }
    std::printf("  %s: %lld of %lld slots bit-identical alone / eager / in a batch of 64\n", c.name,
                static_cast<long long>(equal), static_cast<long long>(checked));
  }
  cuda::register_backend().check_device_errors();
}

TEST(GpuAttention, BatchInvariance) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  std::printf("  decode kernel: %s\n", cuda::attention_path_name(decode_path()));
  check_batch_invariance(r);
}

// attention_heads_kernel on its own (TERN_ATTENTION_DECODE=heads): a slot alone (16 heads a block) and in a
// batch of 64 (32 heads a block: 64 x 5 x 4 blocks of 16 would not fit 132 SMs in one round) and eagerly.
TEST(GpuAttention, HeadsKernelBatchInvariance) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const DecodeKernel heads(cuda::AttentionDecode::heads);
  ASSERT_EQ(decode_path(), cuda::AttentionPath::bf16_tensor_cores_heads);
  std::printf("  decode kernel: %s\n", cuda::attention_path_name(decode_path()));
  check_batch_invariance(r);
}

// attention_heads_kernel (16 and 32 heads a block, and the launch-size choice) against attention_mma_kernel, the
// same inputs: every output bit equal, at batch 1, 16, 64 and 128, at the V4-Flash shapes of DecodeV4Shapes and
// at context ~1K; and against the CPU's eager op (as DecodeV4Shapes checks the old kernel).
TEST(GpuAttention, HeadsKernelSameBits) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  struct Variant {
    cuda::AttentionDecode d;
    const char* name;
  };
  const Variant variants[] = {{cuda::AttentionDecode::heads16, "heads16"},
                              {cuda::AttentionDecode::heads32, "heads32"},
                              {cuda::AttentionDecode::heads, "heads"}};
  for (const Variant& v : variants) {
    const DecodeKernel k(v.d);
    ASSERT_EQ(decode_path(), cuda::AttentionPath::bf16_tensor_cores_heads) << v.name;
    std::printf("  %s: %s\n", v.name, cuda::attention_path_name(decode_path()));
  }
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.insert(cases.end(), std::begin(kCases1K), std::end(kCases1K));
  for (const Case& c : cases) {
    const Attention att(c, 128, r);
    std::vector<Tensor> refs;
    for (int64_t i = 0; i < att.slots(); ++i) refs.push_back(att.reference(i));
    for (int64_t B : {1, 16, 64, 128}) {
      std::vector<int64_t> which(static_cast<size_t>(B));
      std::iota(which.begin(), which.end(), 0);
      Tensor old;
      {
        const DecodeKernel k(cuda::AttentionDecode::cluster);
        old = cuda::to_host(att.decode(which));
      }
      Tensor ref(DType::f32, {B, kH, kHd});
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(ref.data<float>() + b * kH * kHd, refs[b].data<float>(), kH * kHd * sizeof(float));
      for (const Variant& v : variants) {
        const DecodeKernel k(v.d);
        const cuda::DeviceTensor out = att.decode(which);
        const Tensor mine = cuda::to_host(out);
        const int64_t differ = words_differing(mine, old);
        EXPECT_EQ(differ, 0) << c.name << " batch " << B << ", " << v.name << ": " << differ << " of "
                             << mine.numel() << " words differ from attention_mma_kernel's";
        expect_close(out, ref, kTolBf16, cat("step_attention ", v.name, " ", c.name, " batch ", B));
      }
    }
  }
  cuda::register_backend().check_device_errors();
}

// The decode op captured into a CUDA graph (on a private stream) and replayed gives the eager launch's bits,
// for both kernels, at batch 1 and 64 (CSA and HCA at ~1K).
TEST(GpuAttention, DecodeGraphEqualsEager) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  cuda::CudaBackend& be = cuda::register_backend();
  for (const Case& c : kCases1K) {
    const Attention att(c, 64, r);
    for (const cuda::AttentionDecode d : {cuda::AttentionDecode::cluster, cuda::AttentionDecode::heads}) {
      const DecodeKernel k(d);
      for (int64_t B : {1, 64}) {
        std::vector<int64_t> which(static_cast<size_t>(B));
        std::iota(which.begin(), which.end(), 0);
        const Tensor eager = cuda::to_host(att.decode(which));
        const auto l = att.prepare(which);
        CapturedOps graph([&] { l.run(); });
        ASSERT_EQ(graph.error(), "");
        for (int rep = 0; rep < 2; ++rep) {
          cuda::fill_bytes(l.out, 0xff);
          be.synchronize();
          ASSERT_EQ(graph.replay(), "");
          const Tensor replay = cuda::to_host(l.out);
          const int64_t differ = words_differing(replay, eager);
          EXPECT_EQ(differ, 0) << c.name << " batch " << B << " " << cuda::attention_decode_name(d) << " replay "
                               << rep << ": " << differ << " words differ from the eager launch";
        }
      }
    }
  }
  be.check_device_errors();
}

}  // namespace
}  // namespace tern::gputest
