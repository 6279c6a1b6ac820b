// The batched step ops (ops/step.h) on the CPU backend: every active slot must give the bits of
// the eager op (sparse_attention, compressor_update, indexer_topk, the eager ring / paged-row stores) run
// on that slot's own sequence as a one-token chunk at its position; inert slots (position -1) read and
// write no state (their tables point at poison-filled buffers, or are 0); step_compress_emit must give the
// eager emit chain's bits (compressor_update, rms_norm, rope, kv_pack into the pages). Fixture-like shapes and the
// V4-Flash shapes (head_dim 512, 64 heads, window 128, ratios 4 and 128, indexer 64 x 128, top-k 512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/step.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "test_util.h"

namespace tern {
namespace {

int64_t addr(const TensorView& t) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data()));
}
Tensor clone(const TensorView& v) {
  return Tensor::copy_of(v, Device::cpu);
}
bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}
void random_bytes(const TensorView& t, test::Random& rng) {
  auto* b = t.data_as<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<uint8_t>(rng.integer(0, 255));
}
void poison(const TensorView& t) {
  std::memset(t.data(), 0x7f, t.nbytes());
}  // f32 3.4e38, i32 2139062143
// n packed rows of random values
Tensor packed_rows(int64_t n, const ops::KvRowFormat& f, test::Random& rng) {
  Tensor x = rng.tensor({n, f.head_dim}, 2.0f), rows(DType::u8, {n, f.row_bytes()});
  ops::kv_pack(cpu::context(), x, f, rows);
  return rows;
}
Tensor table(const std::vector<int64_t>& v) {
  return test::positions_tensor(v);
}

// ---------------------------------------------------------------------------------------------- attention

struct AttnShape {
  int64_t heads, head_dim, rope_dim, window;
  int ratio;  // 0: SWA
  int topk;   // > 0: CSA (selected rows), 0: every visible compressed row
  int64_t rows_per_page;
};

void check_attention(const AttnShape& sh, ops::KvFormat fmt, const std::vector<int64_t>& positions,
                     uint32_t seed) {
  test::Random rng(seed);
  const ops::KvRowFormat f{fmt, sh.head_dim, sh.rope_dim};
  const int64_t S = static_cast<int64_t>(positions.size()), rb = f.row_bytes(), H = sh.heads,
                hd = sh.head_dim;
  Tensor q = rng.tensor({S, H, hd}), sinks = rng.tensor({H}), rows = packed_rows(S, f, rng);
  std::vector<Tensor> rings(S);
  std::vector<test::PagedCopy> comp(S);
  std::vector<int64_t> ring_addr(S), pool_addr(S), table_addr(S), ncomp(S);
  const int k = sh.topk > 0 ? sh.topk : 1;
  Tensor selected(DType::i32, {S, k});
  int64_t max_compressed = 0;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    rings[i] = packed_rows(sh.window, f, rng);
    ncomp[i] = sh.ratio > 0 && p >= 0 ? (p + 1) / sh.ratio : 0;
    max_compressed = std::max(max_compressed, ncomp[i]);
    comp[i] = test::paged_copy(packed_rows(std::max<int64_t>(ncomp[i], 1), f, rng), sh.rows_per_page, rng);
    // The second inert slot has no addresses at all; the others point at real (for inert: poisoned) state.
    const bool null_slot = p < 0 && i == S - 1;
    ring_addr[i] = null_slot ? 0 : addr(rings[i]);
    pool_addr[i] = null_slot ? 0 : addr(comp[i].pool);
    table_addr[i] = null_slot ? 0 : addr(comp[i].table);
    std::vector<int32_t> pick(std::max<int64_t>(ncomp[i], 0));
    std::iota(pick.begin(), pick.end(), 0);
    std::shuffle(pick.begin(), pick.end(), rng.gen());
    for (int j = 0; j < k; ++j)
      selected.data<int32_t>()[i * k + j] = j < static_cast<int64_t>(pick.size()) ? pick[j] : -1;
  }
  const Tensor pos = table(positions), ring_t = table(ring_addr), pool_t = table(pool_addr),
               table_t = table(table_addr);
  std::vector<Tensor> ring_before, pool_before;
  for (int64_t i = 0; i < S; ++i)
    ring_before.push_back(clone(rings[i])), pool_before.push_back(clone(comp[i].pool));

  ops::StepAttentionArgs a;
  a.q = q;
  a.positions = pos;
  a.format = f;
  a.rows = rows;
  a.rings = ring_t;
  a.window = sh.window;
  a.ratio = sh.ratio;
  if (sh.ratio > 0) {
    a.compressed = {pool_t,           table_t, comp[0].view.page_bytes(), comp[0].view.offset_in_page,
                    sh.rows_per_page, rb};
    a.max_compressed = max_compressed;
  }
  if (sh.topk > 0) a.selected = selected;
  a.sinks = sinks;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor out(DType::f32, {S, H, hd});
  poison(out);
  ops::step_attention(cpu::context(), a, out);

  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    EXPECT_TRUE(same_bytes(rings[i], ring_before[i])) << "slot " << i << ": ring written";
    EXPECT_TRUE(same_bytes(comp[i].pool, pool_before[i])) << "slot " << i << ": compressed rows written";
    const TensorView got = out.view().rows(i, i + 1);
    if (p < 0) {
      const Tensor zeros(DType::f32, {1, H, hd});
      EXPECT_TRUE(same_bytes(got, zeros)) << "inert slot " << i << ": output not zeros";
      continue;
    }
    ops::AttentionArgs e;
    e.q = q.view().rows(i, i + 1);
    e.start = p;
    e.format = f;
    e.chunk_rows = rows.view().rows(i, i + 1);
    e.ring = rings[i];
    e.window = sh.window;
    e.ratio = sh.ratio;
    if (sh.ratio > 0) e.compressed = comp[i].view, e.num_compressed = ncomp[i];
    if (sh.topk > 0) e.selected = selected.view().rows(i, i + 1);
    e.sinks = sinks;
    e.scale = a.scale;
    Tensor want(DType::f32, {1, H, hd});
    ops::sparse_attention(cpu::context(), e, want);
    EXPECT_TRUE(same_bytes(got, want)) << "slot " << i << " at position " << p << ": not the eager bits";
  }
}

const std::vector<int64_t> kSmallPositions = {0, 5, 7, -1, 30, 131, -1};

TEST(StepAttention, SmallSwaMatchesEager) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({3, 128, 64, 8, 0, 0, 3}, fmt, kSmallPositions, 1);
}
TEST(StepAttention, SmallCsaSelectedMatchesEager) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({3, 128, 64, 8, 4, 5, 3}, fmt, kSmallPositions, 2);
}
TEST(StepAttention, SmallHcaAllRowsMatchesEager) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({3, 128, 64, 8, 16, 0, 2}, fmt, {3, 15, 47, -1, 200, 16, -1}, 3);
}
TEST(StepAttention, V4FlashSwa) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({64, 512, 64, 128, 0, 0, 64}, fmt, {0, 127, 300, -1, 129, -1}, 4);
}
TEST(StepAttention, V4FlashCsaTopk512) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({64, 512, 64, 128, 4, 512, 64}, fmt, {2100, 4095, 1000, -1, 3, 2051, -1}, 5);
}
TEST(StepAttention, V4FlashHca) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds})
    check_attention({64, 512, 64, 128, 128, 0, 64}, fmt, {127, 5000, 130, -1, 255, -1}, 6);
}

// --------------------------------------------------------------------------------------------- compressor

void check_compressor(int64_t width, bool overlap, int ratio, const std::vector<int64_t>& positions,
                      uint32_t seed) {
  test::Random rng(seed);
  const int64_t S = static_cast<int64_t>(positions.size()), C = overlap ? 2 * width : width,
                n_acc = overlap ? 2 : 1;
  Tensor ape = rng.tensor({ratio, C}), kv(DType::f32, {S, C}), gate(DType::f32, {S, C});
  std::vector<Tensor> accs(S);
  std::vector<int64_t> acc_addr(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    accs[i] = Tensor(DType::f32, {n_acc, 3, width});
    if (p < 0) {
      random_bytes(accs[i], rng);  // inert: poison that must stay
    } else {
      // The slot's state after tokens 0 .. p-1 of its own sequence, then token p in the batch.
      Tensor seq_kv = rng.tensor({p + 1, C}), seq_gate = rng.tensor({p + 1, C}, 4.0f);
      if (p > 0) {
        Tensor emitted(DType::f32, {std::max<int64_t>(1, p / ratio), width});
        ops::compressor_update(cpu::context(), 
            {accs[i], seq_kv.view().rows(0, p), seq_gate.view().rows(0, p), ape, 0, ratio, overlap, emitted});
      }
      std::memcpy(kv.data<float>() + i * C, seq_kv.data<float>() + p * C, C * sizeof(float));
      std::memcpy(gate.data<float>() + i * C, seq_gate.data<float>() + p * C, C * sizeof(float));
    }
    acc_addr[i] = p < 0 && i == S - 1 ? 0 : addr(accs[i]);
  }
  std::vector<Tensor> before;
  for (const Tensor& t : accs) before.push_back(clone(t));
  const Tensor pos = table(positions), acc_t = table(acc_addr);
  Tensor emitted(DType::f32, {S, width});
  poison(emitted);
  const Tensor poisoned = clone(emitted);
  ops::step_compressor(cpu::context(), {acc_t, kv, gate, ape, pos, ratio, overlap, width, emitted});

  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    const TensorView got_row = emitted.view().rows(i, i + 1), poison_row = poisoned.view().rows(i, i + 1);
    if (p < 0) {
      EXPECT_TRUE(same_bytes(accs[i], before[i])) << "inert slot " << i << ": accumulator written";
      EXPECT_TRUE(same_bytes(got_row, poison_row)) << "inert slot " << i << ": emitted row written";
      continue;
    }
    Tensor want_acc = clone(before[i]), want_row(DType::f32, {1, width});
    poison(want_row);
    const int64_t e = ops::compressor_update(cpu::context(), 
        {want_acc, kv.view().rows(i, i + 1), gate.view().rows(i, i + 1), ape, p, ratio, overlap, want_row});
    EXPECT_EQ(e, (p + 1) % ratio == 0 ? 1 : 0);
    EXPECT_TRUE(same_bytes(accs[i], want_acc)) << "slot " << i << " at position " << p << ": accumulator";
    EXPECT_TRUE(same_bytes(got_row, want_row)) << "slot " << i << " at position " << p << ": emitted row";
  }
}

TEST(StepCompressor, SmallHcaMatchesEager) {
  check_compressor(24, false, 4, {0, 3, 6, 7, -1, 41, 103, -1}, 11);
}
TEST(StepCompressor, SmallCsaOverlapMatchesEager) {
  check_compressor(24, true, 4, {0, 3, 6, 7, -1, 41, 103, -1}, 12);
}
TEST(StepCompressor, V4FlashCsaRatio4) {
  check_compressor(512, true, 4, {0, 3, 6, 1003, -1, 1100, -1}, 13);
}
TEST(StepCompressor, V4FlashHcaRatio128) {
  check_compressor(512, false, 128, {5, 127, 255, -1, 300, -1}, 14);
}
TEST(StepCompressor, V4FlashIndexerRatio4) {
  check_compressor(128, true, 4, {1, 3, 1023, -1, 1026, -1}, 15);
}

// ------------------------------------------------------------------------------------ compressor emit chain

// The slot's state after tokens 0 .. p-1 of its own sequence (p < 0: poison that must stay), and token p's
// kv / gate as row i of the batch's.
Tensor compressor_state(int64_t p, int64_t i, int ratio, bool overlap, int64_t width, const Tensor& ape,
                        Tensor& kv, Tensor& gate, test::Random& rng) {
  const int64_t C = overlap ? 2 * width : width;
  Tensor acc(DType::f32, {overlap ? 2 : 1, 3, width});
  if (p < 0) {
    random_bytes(acc, rng);
    return acc;
  }
  Tensor seq_kv = rng.tensor({p + 1, C}), seq_gate = rng.tensor({p + 1, C}, 4.0f);
  if (p > 0) {
    Tensor emitted(DType::f32, {std::max<int64_t>(1, p / ratio), width});
    ops::compressor_update(cpu::context(), 
        {acc, seq_kv.view().rows(0, p), seq_gate.view().rows(0, p), ape, 0, ratio, overlap, emitted});
  }
  std::memcpy(kv.data<float>() + i * C, seq_kv.data<float>() + p * C, C * sizeof(float));
  std::memcpy(gate.data<float>() + i * C, seq_gate.data<float>() + p * C, C * sizeof(float));
  return acc;
}

// step_compress_emit against the eager chain on each slot's own state: compressor_update of the one
// token, then for an entry rms_norm, rope at (p / ratio) * ratio and kv_pack into row p / ratio of its pages.
void check_compress_emit(int64_t width, bool overlap, int ratio, ops::KvFormat fmt,
                         const std::vector<int64_t>& positions, uint32_t seed) {
  test::Random rng(seed);
  const ops::KvRowFormat f{fmt, width, 64};
  const int64_t S = static_cast<int64_t>(positions.size()), C = overlap ? 2 * width : width, rb = f.row_bytes(),
                rows_per_page = 3;
  const float eps = 1e-6f;
  Tensor ape = rng.tensor({ratio, C}), kv(DType::f32, {S, C}), gate(DType::f32, {S, C});
  Tensor norm = rng.tensor({width}), inv_freq = ops::rope_inv_freq({160000.0, 64, true, 16.0, 65536.0, 32.0, 1.0});
  std::vector<Tensor> accs(S), want_accs(S), want_pools(S);
  std::vector<test::PagedCopy> dest(S);
  std::vector<int64_t> acc_addr(S), pool_addr(S), table_addr(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    accs[i] = compressor_state(p, i, ratio, overlap, width, ape, kv, gate, rng);
    Tensor old(DType::u8, {std::max<int64_t>(1, p / ratio + 1), rb});
    random_bytes(old, rng);
    dest[i] = test::paged_copy(old, rows_per_page, rng);
    want_accs[i] = clone(accs[i]);
    want_pools[i] = clone(dest[i].pool);
    const bool null_slot = p < 0 && i == S - 1;
    acc_addr[i] = null_slot ? 0 : addr(accs[i]);
    pool_addr[i] = null_slot ? 0 : addr(dest[i].pool);
    table_addr[i] = null_slot ? 0 : addr(dest[i].table);
    if (p < 0) continue;
    Tensor row(DType::f32, {1, width});
    const int64_t e = ops::compressor_update(cpu::context(), 
        {want_accs[i], kv.view().rows(i, i + 1), gate.view().rows(i, i + 1), ape, p, ratio, overlap, row});
    if (e == 0) continue;
    ops::rms_norm(cpu::context(), row, norm, eps, row);
    ops::rope(cpu::context(), row, table({p / ratio * ratio}), inv_freq);
    test::PagedCopy w = dest[i];
    w.view.pool = want_pools[i];
    ops::kv_pack(cpu::context(), row, f, TensorView(w.view.row(p / ratio), DType::u8, {1, rb}));
  }
  const Tensor pos = table(positions), acc_t = table(acc_addr), pool_t = table(pool_addr),
               table_t = table(table_addr);
  ops::StepCompressEmitArgs a;
  a.compressor = {acc_t, kv, gate, ape, pos, ratio, overlap, width, {}};
  a.norm = norm;
  a.eps = eps;
  a.inv_freq = inv_freq;
  a.format = f;
  a.dest = {pool_t, table_t, dest[0].view.page_bytes(), dest[0].view.offset_in_page, rows_per_page, rb};
  ops::step_compress_emit(cpu::context(), a);
  for (int64_t i = 0; i < S; ++i) {
    EXPECT_TRUE(same_bytes(accs[i], want_accs[i])) << "slot " << i << " at " << positions[i] << ": accumulator";
    EXPECT_TRUE(same_bytes(dest[i].pool, want_pools[i])) << "slot " << i << " at " << positions[i] << ": rows";
  }
}

TEST(StepCompressEmit, SmallMatchesEagerChain) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds}) {
    check_compress_emit(128, true, 4, fmt, {0, 3, 6, 7, -1, 41, 103, -1}, 61);
    check_compress_emit(128, false, 16, fmt, {15, 16, 47, -1, 200, -1}, 62);
  }
}
TEST(StepCompressEmit, V4Flash) {
  for (auto fmt : {ops::KvFormat::f32, ops::KvFormat::fp8_ds}) {
    check_compress_emit(512, true, 4, fmt, {0, 3, 6, 1003, -1, 1100, -1}, 63);
    check_compress_emit(512, false, 128, fmt, {5, 127, 255, -1, 300, -1}, 64);
  }
  check_compress_emit(128, true, 4, ops::KvFormat::f32, {1, 3, 1023, -1, 1026, -1}, 65);  // indexer keys
}

// ---------------------------------------------------------------------------------------------- indexer

void check_indexer(int64_t heads, int64_t dim, int topk, int ratio, int64_t rows_per_page,
                   const std::vector<int64_t>& positions, uint32_t seed) {
  test::Random rng(seed);
  const int64_t S = static_cast<int64_t>(positions.size());
  Tensor q = rng.tensor({S, heads, dim}), w = rng.tensor({S, heads});
  std::vector<test::PagedCopy> keys(S);
  std::vector<int64_t> nk(S), pool_addr(S), table_addr(S);
  int64_t max_keys = 0;
  for (int64_t i = 0; i < S; ++i) {
    nk[i] = positions[i] < 0 ? 0 : (positions[i] + 1) / ratio;
    max_keys = std::max(max_keys, nk[i]);
    keys[i] = test::paged_copy(rng.tensor({std::max<int64_t>(1, nk[i]), dim}), rows_per_page, rng);
    const bool null_slot = positions[i] < 0 && i == S - 1;
    pool_addr[i] = null_slot ? 0 : addr(keys[i].pool);
    table_addr[i] = null_slot ? 0 : addr(keys[i].table);
  }
  std::vector<Tensor> before;
  for (const auto& k : keys) before.push_back(clone(k.pool));
  const Tensor pos = table(positions), pool_t = table(pool_addr), table_t = table(table_addr);
  ops::StepIndexerArgs a;
  a.q = q;
  a.weights = w;
  a.keys = {pool_t, table_t, keys[0].view.page_bytes(), keys[0].view.offset_in_page, rows_per_page, dim * 4};
  a.positions = pos;
  a.ratio = ratio;
  a.max_keys = max_keys;
  Tensor idx(DType::i32, {S, topk});
  poison(idx);
  ops::step_indexer_topk(cpu::context(), a, topk, idx);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    EXPECT_TRUE(same_bytes(keys[i].pool, before[i])) << "slot " << i << ": keys written";
    const TensorView got = idx.view().rows(i, i + 1);
    Tensor want(DType::i32, {1, topk});
    if (p < 0) {
      std::fill_n(want.data<int32_t>(), topk, -1);
    } else {
      ops::IndexerArgs e{q.view().rows(i, i + 1),
                         w.view().rows(i, i + 1),
                         keys[i].view,
                         nk[i],
                         pos.view().rows(i, i + 1),
                         ratio};
      ops::indexer_topk(cpu::context(), e, topk, want);
    }
    EXPECT_TRUE(same_bytes(got, want)) << "slot " << i << " at position " << p << ": not the eager top-k";
  }
}

TEST(StepIndexerTopk, SmallMatchesEager) {
  check_indexer(4, 32, 4, 4, 2, {0, 3, 10, 17, -1, 40, -1}, 21);
}
TEST(StepIndexerTopk, V4FlashTopk512) {
  check_indexer(64, 128, 512, 4, 64, {2100, 4095, 1000, 2, -1, 3, 2047, -1}, 22);
}

// ------------------------------------------------------------------------------------------ row stores

void check_store_ring(int64_t window, int64_t row_bytes, const std::vector<int64_t>& positions,
                      uint32_t seed) {
  test::Random rng(seed);
  const int64_t S = static_cast<int64_t>(positions.size());
  Tensor rows(DType::u8, {S, row_bytes});
  random_bytes(rows, rng);
  std::vector<Tensor> rings(S), want(S);
  std::vector<int64_t> ring_addr(S);
  for (int64_t i = 0; i < S; ++i) {
    rings[i] = Tensor(DType::u8, {window, row_bytes});
    random_bytes(rings[i], rng);
    want[i] = clone(rings[i]);
    const int64_t p = positions[i];
    if (p >= 0)  // the eager store (SequenceState::store_window_rows): position p at ring slot p % window
      std::memcpy(want[i].data<uint8_t>() + (p % window) * row_bytes, rows.data<uint8_t>() + i * row_bytes,
                  row_bytes);
    ring_addr[i] = p < 0 && i == S - 1 ? 0 : addr(rings[i]);
  }
  ops::store_ring_rows(cpu::context(), rows, table(ring_addr), table(positions), {}, window);
  for (int64_t i = 0; i < S; ++i)
    EXPECT_TRUE(same_bytes(rings[i], want[i])) << "slot " << i << " at position " << positions[i];
}

TEST(StoreRingRows, Small) {
  check_store_ring(8, 64, {0, 7, 8, 100, -1, 3, -1}, 31);
}
TEST(StoreRingRows, V4Flash) {
  const ops::KvRowFormat fp8{ops::KvFormat::fp8_ds, 512, 64};
  check_store_ring(128, fp8.row_bytes(), {0, 127, 128, 5000, -1, 64, -1}, 32);
  check_store_ring(128, 512 * 4, {0, 127, 128, 5000, -1, 64, -1}, 33);
}

void check_store_paged(int ratio, int64_t row_bytes, int64_t rows_per_page,
                       const std::vector<int64_t>& positions, uint32_t seed) {
  test::Random rng(seed);
  const int64_t S = static_cast<int64_t>(positions.size());
  Tensor rows(DType::u8, {S, row_bytes});
  random_bytes(rows, rng);
  std::vector<test::PagedCopy> dest(S);
  std::vector<Tensor> want(S);
  std::vector<int64_t> pool_addr(S), table_addr(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    Tensor old(DType::u8, {std::max<int64_t>(1, p / ratio + 1), row_bytes});
    random_bytes(old, rng);
    dest[i] = test::paged_copy(old, rows_per_page, rng);
    test::PagedCopy w = dest[i];
    want[i] = clone(dest[i].pool);
    w.view.pool = want[i];
    if (p >= 0 && (p + 1) % ratio == 0)  // the eager store: entry p / ratio, when p closes its window
      std::memcpy(w.view.row(p / ratio), rows.data<uint8_t>() + i * row_bytes, row_bytes);
    const bool null_slot = p < 0 && i == S - 1;
    pool_addr[i] = null_slot ? 0 : addr(dest[i].pool);
    table_addr[i] = null_slot ? 0 : addr(dest[i].table);
  }
  const Tensor pool_t = table(pool_addr), table_t = table(table_addr);
  const ops::StepPagedRows d{
      pool_t, table_t, dest[0].view.page_bytes(), dest[0].view.offset_in_page, rows_per_page, row_bytes};
  ops::store_paged_rows(cpu::context(), rows, d, table(positions), ratio);
  for (int64_t i = 0; i < S; ++i)
    EXPECT_TRUE(same_bytes(dest[i].pool, want[i])) << "slot " << i << " at position " << positions[i];
}

TEST(StorePagedRows, Small) {
  check_store_paged(4, 64, 3, {0, 3, 6, 7, -1, 43, 102, -1}, 41);
  check_store_paged(16, 64, 2, {15, 16, 47, -1, 200, -1}, 42);
}
TEST(StorePagedRows, V4Flash) {
  const ops::KvRowFormat fp8{ops::KvFormat::fp8_ds, 512, 64};
  check_store_paged(4, fp8.row_bytes(), 64, {3, 4, 2099, 4095, -1, 1000, -1}, 43);
  check_store_paged(4, 128 * 4, 64, {3, 4, 2099, 4095, -1, 1000, -1}, 44);
  check_store_paged(128, fp8.row_bytes(), 64, {127, 128, 5119, -1, 300, -1}, 45);
}

// --------------------------------------------------------------------------------------------- bad input

TEST(StepOps, RejectBadInput) {
  test::Random rng(51);
  const ops::KvRowFormat f{ops::KvFormat::f32, 128, 64};
  const int64_t S = 2, H = 2, window = 8;
  Tensor q = rng.tensor({S, H, 128}), sinks = rng.tensor({H}), rows = packed_rows(S, f, rng);
  Tensor ring = packed_rows(window, f, rng);
  ops::StepAttentionArgs a;
  a.q = q;
  Tensor pos = table({5, -1});
  a.positions = pos;
  a.format = f;
  a.rows = rows;
  Tensor rings = table({addr(ring), 0});
  a.rings = rings;
  a.window = window;
  a.sinks = sinks;
  Tensor out(DType::f32, {S, H, 128});
  EXPECT_NO_THROW(ops::step_attention(cpu::context(), a, out));
  Tensor no_ring = table({0, 0});  // an active slot without a ring
  a.rings = no_ring;
  EXPECT_THROW(ops::step_attention(cpu::context(), a, out), Error);
  a.rings = rings;
  Tensor pos32(DType::i32, {S});
  a.positions = pos32;
  EXPECT_THROW(ops::step_attention(cpu::context(), a, out), Error);
  a.positions = pos;
  Tensor bad_sinks = rng.tensor({H + 1});
  a.sinks = bad_sinks;
  EXPECT_THROW(ops::step_attention(cpu::context(), a, out), Error);
  a.sinks = sinks;
  Tensor out_i32(DType::i32, {S, H, 128});
  EXPECT_THROW(ops::step_attention(cpu::context(), a, out_i32), Error);

  Tensor acc(DType::f32, {1, 3, 16}), kv = rng.tensor({S, 16}), gate = rng.tensor({S, 16}),
                                      ape = rng.tensor({4, 16});
  Tensor emitted(DType::f32, {S, 16}), short_emitted(DType::f32, {S - 1, 16});
  Tensor accs = table({addr(acc), 0});
  EXPECT_NO_THROW(ops::step_compressor(cpu::context(), {accs, kv, gate, ape, pos, 4, false, 16, emitted}));
  EXPECT_THROW(ops::step_compressor(cpu::context(), {accs, kv, gate, ape, pos, 4, false, 16, short_emitted}),
               Error);
  EXPECT_THROW(
      ops::step_compressor(cpu::context(), {table({0, 0}), kv, gate, ape, pos, 4, false, 16, emitted}),
      Error);

  // step_compress_emit: the rows' format must be the entries' width and the destination's row size.
  const ops::KvRowFormat f16{ops::KvFormat::f32, 16, 8};
  Tensor norm = rng.tensor({16}), inv_freq = rng.tensor({4}), pool(DType::u8, {1, 256});
  Tensor page_table(DType::i32, {1});
  Tensor pools = table({addr(pool), 0}), tables = table({addr(page_table), 0});
  ops::StepCompressEmitArgs e{{accs, kv, gate, ape, pos, 4, false, 16, {}}, norm, 1e-6f, inv_freq, f16,
                                {pools, tables, 256, 0, 4, 64}};
  EXPECT_NO_THROW(ops::step_compress_emit(cpu::context(), e));
  e.format.head_dim = 32;
  EXPECT_THROW(ops::step_compress_emit(cpu::context(), e), Error);
  e.format = f16;
  e.dest.row_bytes = 32;
  EXPECT_THROW(ops::step_compress_emit(cpu::context(), e), Error);
  e.dest.row_bytes = 64;
  e.compressor.emitted = emitted;
  EXPECT_THROW(ops::step_compress_emit(cpu::context(), e), Error);

  Tensor closing = table({7, -1}), r(DType::u8, {S, 64});
  const Tensor zeros = table({0, 0});
  const ops::StepPagedRows nowhere{zeros, zeros, 256, 0, 4, 64};
  EXPECT_THROW(ops::store_paged_rows(cpu::context(), r, nowhere, closing, 4), Error);
  EXPECT_NO_THROW(ops::store_paged_rows(cpu::context(), r, nowhere, table({6, -1}),
                                        4));  // closes no window: writes nothing
  EXPECT_THROW(ops::store_ring_rows(cpu::context(), r, table({0, 0}), closing, {}, 8), Error);
}

}  // namespace
}  // namespace tern
