// GPU vs CPU: the batched step ops (ops/step.h) other than attention (test_gpu_attention.cpp) at the
// V4-Flash shapes, each run on the CUDA backend (device address tables) and on the CPU backend's batched
// reference (host address tables) over the same random slots: several positions per batch, windows that
// close and ones that don't, inert slots (position -1; one with poisoned state that must stay untouched,
// one with 0 addresses). step_compress_emit is also compared bit for bit with the unfused chain on the GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "ops/compressor.h"
#include "ops/step.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace tern::gputest {
namespace {

void random_bytes(const TensorView& t, Rand& r) {
  for (size_t i = 0; i < t.nbytes(); ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(r.bits());
}
bool same_bytes(const TensorView& host, const TensorView& device) {
  const Tensor d = cuda::to_host(device);
  return host.nbytes() == d.nbytes() && std::memcmp(host.data(), d.view().data(), host.nbytes()) == 0;
}

void check_step_compressor(int ratio, bool overlap, int64_t width, const std::vector<int64_t>& positions,
                           Rand& r, const char* name) {
  const int64_t S = static_cast<int64_t>(positions.size()), C = width * (overlap ? 2 : 1),
                n_acc = overlap ? 2 : 1;
  Tensor ape = random_f32({ratio, C}, r), kv = random_f32({S, C}, r), gate = random_f32({S, C}, r, 2.0f);
  std::vector<Tensor> accs(S), before(S);
  std::vector<cuda::DeviceTensor> daccs(S);
  std::vector<int64_t> host_addr(S), dev_addr(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    accs[i] = Tensor(DType::f32, {n_acc, 3, width});
    if (p < 0) {
      random_bytes(accs[i], r);  // inert: must stay
    } else if (p > 0) {          // the state after tokens 0 .. p-1
      Tensor pk = random_f32({p, C}, r), pg = random_f32({p, C}, r, 2.0f);
      Tensor em(DType::f32, {std::max<int64_t>(1, p / ratio), width});
      ops::compressor_update(cpu::context(), {accs[i], pk, pg, ape, 0, ratio, overlap, em});
    }
    before[i] = Tensor::copy_of(accs[i], Device::cpu);
    daccs[i] = upload(accs[i]);
    const bool null_slot = p < 0 && i == S - 1;
    host_addr[i] = null_slot ? 0 : addr(accs[i]);
    dev_addr[i] = null_slot ? 0 : addr(daccs[i]);
  }
  const Tensor pos = i64(positions), hacc = i64(host_addr), dacc_t = i64(dev_addr);
  Tensor emitted(DType::f32, {S, width});
  ops::step_compressor(cpu::context(), {hacc, kv, gate, ape, pos, ratio, overlap, width, emitted});
  auto dkv = upload(kv), dgate = upload(gate), dape = upload(ape), dpos = upload(pos), dtab = upload(dacc_t);
  auto dem = poisoned(DType::f32, {S, width});
  ops::step_compressor(cuda::context(), {dtab, dkv, dgate, dape, dpos, ratio, overlap, width, dem});
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    if (p < 0) {
      EXPECT_TRUE(same_bytes(before[i], daccs[i]))
          << name << ": inert slot " << i << "'s accumulator written";
      continue;
    }
    EXPECT_LE(compare(daccs[i], accs[i]).rel_err, kTolF32)
        << name << ": slot " << i << " at " << p << " accumulator";
    if ((p + 1) % ratio == 0)
      expect_close(dem.view().rows(i, i + 1), emitted.view().rows(i, i + 1), kTolF32,
                   cat(name, " emitted, slot ", i, " at ", p));
  }
}

TEST(GpuStepOps, Compressor) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const std::vector<int64_t> pos4 = {0, 3, 6, 1003, -1, 1100, 2047, -1};
  check_step_compressor(4, true, 512, pos4, r, "step_compressor csa");
  check_step_compressor(4, true, 128, pos4, r, "step_compressor csa indexer");
  check_step_compressor(128, false, 512, {5, 127, 255, -1, 300, 4095, -1}, r, "step_compressor hca");
  cuda::register_backend().check_device_errors();
}

// step_compress_emit on the GPU: bit for bit the unfused chain on the GPU (step_compressor, rms_norm,
// rope, kv_pack, store_paged_rows: the prefill path's kernels, which batch invariance compares it with) on
// twin copies of the same state, and within tolerance of the CPU's op (FP8 rows: an ulp upstream may move
// an e4m3 rounding).
// stacked: kv and gate are column ranges of one product's output (row-strided, as the model's stacked
// wkv + wgate gives them).
void check_compress_emit(int ratio, bool overlap, int64_t width, ops::KvFormat fmt, bool bf16_norm, bool stacked,
                         const std::vector<int64_t>& positions, Rand& r, const char* name) {
  const int64_t S = static_cast<int64_t>(positions.size()), C = width * (overlap ? 2 : 1),
                n_acc = overlap ? 2 : 1, rpp = 64;
  const ops::KvRowFormat f{fmt, width, 64};
  const int64_t rb = f.row_bytes();
  const float eps = 1e-6f;
  Tensor ape = random_f32({ratio, C}, r), both = random_f32({S, 2 * C}, r, 1.5f);
  Tensor kv_rows = random_f32({S, C}, r), gate_rows = random_f32({S, C}, r, 2.0f);
  const TensorView kv = stacked ? both.view().cols(0, C) : kv_rows.view(),
                   gate = stacked ? both.view().cols(C, 2 * C) : gate_rows.view();
  Tensor norm = bf16_norm ? random_bf16({width}, r) : random_f32({width}, r);
  Tensor inv_freq = ops::rope_inv_freq({160000.0, 64, true, 16.0, 65536.0, 32.0, 1.0});
  std::vector<Tensor> accs(S), acc_before(S), pool_before(S);
  std::vector<cuda::DeviceTensor> acc_fused(S), acc_unfused(S), pool_unfused(S);
  std::vector<PagedPair> dest;
  std::vector<int64_t> h_acc(S), h_pool(S), h_table(S), f_acc(S), u_acc(S), f_pool(S), u_pool(S), d_table(S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    accs[i] = Tensor(DType::f32, {n_acc, 3, width});
    if (p < 0) {
      random_bytes(accs[i], r);  // inert: must stay
    } else if (p > 0) {          // the state after tokens 0 .. p-1
      Tensor pk = random_f32({p, C}, r), pg = random_f32({p, C}, r, 2.0f);
      Tensor em(DType::f32, {std::max<int64_t>(1, p / ratio), width});
      ops::compressor_update(cpu::context(), {accs[i], pk, pg, ape, 0, ratio, overlap, em});
    }
    acc_before[i] = Tensor::copy_of(accs[i], Device::cpu);
    acc_fused[i] = upload(accs[i]);
    acc_unfused[i] = upload(accs[i]);
    Tensor old(DType::u8, {std::max<int64_t>(1, p / ratio + 1), rb});
    random_bytes(old, r);
    dest.push_back(paged_pair(old, rpp, r));
    pool_before[i] = Tensor::copy_of(dest[i].host_pool, Device::cpu);
    pool_unfused[i] = upload(dest[i].host_pool);
    const bool null_slot = p < 0 && i == S - 1;
    auto at = [&](const TensorView& t) { return null_slot ? 0 : addr(t); };
    h_acc[i] = at(accs[i]), h_pool[i] = at(dest[i].host_pool), h_table[i] = at(dest[i].host_table);
    f_acc[i] = at(acc_fused[i]), u_acc[i] = at(acc_unfused[i]);
    f_pool[i] = at(dest[i].device_pool), u_pool[i] = at(pool_unfused[i]), d_table[i] = at(dest[i].device_table);
  }
  const PagedRows& geo = dest[0].host;
  const Tensor pos = i64(positions), host_accs = i64(h_acc), host_pools = i64(h_pool), host_tables = i64(h_table);
  ops::StepCompressEmitArgs a;
  a.compressor = {host_accs, kv, gate, ape, pos, ratio, overlap, width, {}};
  a.norm = norm;
  a.eps = eps;
  a.inv_freq = inv_freq;
  a.format = f;
  a.dest = {host_pools, host_tables, geo.page_bytes(), geo.offset_in_page, rpp, rb};
  ops::step_compress_emit(cpu::context(), a);  // the CPU reference

  auto dboth = upload(both), dkv_rows = upload(kv_rows), dgate_rows = upload(gate_rows), dape = upload(ape),
       dpos = upload(pos), dnorm = upload(norm), dfreq = upload(inv_freq), dtables = upload(i64(d_table));
  const TensorView dkv = stacked ? dboth.view().cols(0, C) : dkv_rows.view(),
                   dgate = stacked ? dboth.view().cols(C, 2 * C) : dgate_rows.view();
  auto fused_accs = upload(i64(f_acc)), fused_pools = upload(i64(f_pool));
  ops::StepCompressEmitArgs da = a;
  da.compressor = {fused_accs, dkv, dgate, dape, dpos, ratio, overlap, width, {}};
  da.norm = dnorm;
  da.inv_freq = dfreq;
  da.dest.pools = fused_pools;
  da.dest.tables = dtables;
  ops::step_compress_emit(cuda::context(), da);

  // The unfused chain as Model::compress_step runs it with TERN_FUSED_COMPRESS=0.
  std::vector<int64_t> entries(S);
  for (int64_t i = 0; i < S; ++i) entries[i] = positions[i] < 0 ? 0 : positions[i] / ratio * ratio;
  auto unfused_accs = upload(i64(u_acc)), unfused_pools = upload(i64(u_pool)), dentries = upload(i64(entries));
  auto emitted = upload(Tensor(DType::f32, {S, width})), rows = upload(Tensor(DType::u8, {S, rb}));
  ops::step_compressor(cuda::context(),
                       {unfused_accs, dkv, dgate, dape, dpos, ratio, overlap, width, emitted});
  ops::rms_norm(cuda::context(), emitted, dnorm, eps, emitted);
  ops::rope(cuda::context(), emitted, dentries, dfreq);
  ops::kv_pack(cuda::context(), emitted, f, rows);
  ops::store_paged_rows(cuda::context(), rows,
                        {unfused_pools, dtables, geo.page_bytes(), geo.offset_in_page, rpp, rb}, dpos, ratio);

  const double row_tol = fmt == ops::KvFormat::fp8_ds ? kTolBf16 : kTolF32;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t p = positions[i];
    const std::string slot = cat(name, ": slot ", i, " at ", p);
    const Tensor fused_acc = cuda::to_host(acc_fused[i]);
    Tensor fused_pool = cuda::to_host(dest[i].device_pool);
    EXPECT_TRUE(same_bytes(fused_acc, acc_unfused[i])) << slot << ": accumulators differ from the unfused chain's";
    EXPECT_TRUE(same_bytes(fused_pool, pool_unfused[i])) << slot << ": rows differ from the unfused chain's";
    const bool closes = p >= 0 && (p + 1) % ratio == 0;
    if (p < 0) {
      EXPECT_TRUE(same_bytes(acc_before[i], acc_fused[i])) << slot << ": inert slot's accumulators written";
    } else {
      EXPECT_LE(compare(acc_fused[i], accs[i]).rel_err, kTolF32) << slot << ": accumulators vs the CPU";
    }
    if (!closes) {
      EXPECT_TRUE(same_bytes(pool_before[i], dest[i].device_pool)) << slot << ": rows written without an entry";
      continue;
    }
    // The stored entry decoded on the host, GPU vs CPU; every other byte of the pool as before.
    PagedRows got = dest[i].host;
    got.pool = fused_pool;
    Tensor want_row(DType::f32, {1, width}), got_row(DType::f32, {1, width});
    ops::decode_kv_row(dest[i].host.row(p / ratio), f, want_row.data<float>());
    ops::decode_kv_row(got.row(p / ratio), f, got_row.data<float>());
    expect_close(upload(got_row), want_row, row_tol, cat(slot, " entry"));
    std::memcpy(got.row(p / ratio), dest[i].host.row(p / ratio), rb);
    EXPECT_EQ(std::memcmp(fused_pool.data<uint8_t>(), dest[i].host_pool.data<uint8_t>(), fused_pool.nbytes()), 0)
        << slot << ": bytes outside the entry's row written";
  }
}

TEST(GpuStepOps, CompressEmit) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const std::vector<int64_t> pos4 = {0, 3, 6, 1003, -1, 1100, 2047, -1};
  const std::vector<int64_t> pos128 = {5, 127, 255, -1, 300, 4095, -1};
  for (auto fmt : {ops::KvFormat::fp8_ds, ops::KvFormat::f32}) {
    const bool fp8 = fmt == ops::KvFormat::fp8_ds;
    check_compress_emit(4, true, 512, fmt, fp8, fp8, pos4, r, fp8 ? "csa fp8" : "csa f32");
    check_compress_emit(128, false, 512, fmt, !fp8, !fp8, pos128, r, fp8 ? "hca fp8" : "hca f32");
  }
  check_compress_emit(4, true, 128, ops::KvFormat::f32, true, true, pos4, r, "csa indexer keys");
  cuda::register_backend().check_device_errors();
}

// Sequences of q = 1..5 tokens (verify-shaped) through step_compress_emit and step_compressor with `firsts`, at
// V4-Flash's widths: the GPU against the CPU's step op (the eager chunk per sequence) on the same states: the
// accumulators after the step, the entries stored (one chunk may close two windows), the emitted rows at their
// closing tokens' slots. Chunks start at every offset in a window.
void check_compress_sequences(int ratio, bool overlap, int64_t width, Rand& r, const char* name) {
  const int64_t C = width * (overlap ? 2 : 1), n_acc = overlap ? 2 : 1, rpp = 64;
  const ops::KvRowFormat f{ops::KvFormat::f32, width, 64};
  const int64_t rb = f.row_bytes();
  std::vector<int64_t> qs, starts;
  for (int64_t k = 0; k < 10; ++k) qs.push_back(1 + k % std::min<int64_t>(5, ratio + 1)), starts.push_back(40 * ratio + 3 * k);
  int64_t S = 0;
  for (int64_t q : qs) S += q;
  Tensor ape = random_f32({ratio, C}, r), kv = random_f32({S, C}, r), gate = random_f32({S, C}, r, 2.0f);
  Tensor norm = random_f32({width}, r), inv_freq = ops::rope_inv_freq({160000.0, 64, true, 16.0, 65536.0, 32.0, 1.0});
  std::vector<Tensor> accs;
  std::vector<cuda::DeviceTensor> daccs;
  std::vector<PagedPair> dest;
  std::vector<int64_t> pos(S), firsts(S), h_acc(S), d_acc(S), h_pool(S), h_table(S), d_pool(S), d_table(S);
  for (size_t k = 0, i0 = 0; k < qs.size(); i0 += qs[k], ++k) {
    const int64_t P = starts[k];
    accs.emplace_back(DType::f32, Shape{n_acc, 3, width});
    Tensor pk = random_f32({P, C}, r), pg = random_f32({P, C}, r, 2.0f), em(DType::f32, {P / ratio, width});
    ops::compressor_update(cpu::context(),
                           {accs.back(), pk, pg, ape, 0, ratio, overlap, em});  // the state after 0 .. P-1
    daccs.push_back(upload(accs.back()));
    Tensor old(DType::u8, {(P + qs[k]) / ratio + 1, rb});
    random_bytes(old, r);
    dest.push_back(paged_pair(old, rpp, r));
    for (int64_t t = 0; t < qs[k]; ++t) {
      const size_t i = i0 + static_cast<size_t>(t);
      pos[i] = P + t, firsts[i] = static_cast<int64_t>(i0);
      h_acc[i] = addr(accs.back()), d_acc[i] = addr(daccs.back());
      h_pool[i] = addr(dest.back().host_pool), h_table[i] = addr(dest.back().host_table);
      d_pool[i] = addr(dest.back().device_pool), d_table[i] = addr(dest.back().device_table);
    }
  }
  const PagedRows& geo = dest[0].host;
  const int64_t max_q = *std::max_element(qs.begin(), qs.end());
  // The address tables as named tensors: the args hold views, which must not outlive them.
  const Tensor t_acc = i64(h_acc), t_pos = i64(pos), t_firsts = i64(firsts), t_pool = i64(h_pool), t_table = i64(h_table);
  ops::StepCompressEmitArgs a;
  a.compressor = {t_acc, kv, gate, ape, t_pos, ratio, overlap, width, {}, t_firsts, max_q};
  a.norm = norm, a.eps = 1e-6f, a.inv_freq = inv_freq, a.format = f;
  a.dest = {t_pool, t_table, geo.page_bytes(), geo.offset_in_page, rpp, rb};
  ops::step_compress_emit(cpu::context(), a);  // the CPU reference
  auto dkv = upload(kv), dgate = upload(gate), dape = upload(ape), dpos = upload(i64(pos)), dfirsts = upload(i64(firsts)),
       dacc_t = upload(i64(d_acc)), dpools = upload(i64(d_pool)), dtables = upload(i64(d_table)), dnorm = upload(norm),
       dfreq = upload(inv_freq);
  ops::StepCompressEmitArgs da = a;
  da.compressor = {dacc_t, dkv, dgate, dape, dpos, ratio, overlap, width, {}, dfirsts, max_q};
  da.norm = dnorm, da.inv_freq = dfreq;
  da.dest.pools = dpools, da.dest.tables = dtables;
  ops::step_compress_emit(cuda::context(), da);
  for (size_t k = 0; k < qs.size(); ++k) {
    const std::string seq = cat(name, ": sequence ", k, " (", qs[k], " tokens from ", starts[k], ")");
    EXPECT_LE(compare(daccs[k], accs[k]).rel_err, kTolF32) << seq << ": accumulators";
    const Tensor got_pool = cuda::to_host(dest[k].device_pool);
    PagedRows got = dest[k].host;
    got.pool = got_pool;
    for (int64_t e = starts[k] / ratio; e < (starts[k] + qs[k]) / ratio; ++e) {  // the entries the chunk closed
      Tensor want_row(DType::f32, {1, width}), got_row(DType::f32, {1, width});
      ops::decode_kv_row(dest[k].host.row(e), f, want_row.data<float>());
      ops::decode_kv_row(got.row(e), f, got_row.data<float>());
      expect_close(upload(got_row), want_row, kTolF32, cat(seq, " entry ", e));
    }
  }
  // step_compressor with firsts: each closing token's slot gets its entry.
  Tensor emitted(DType::f32, {S, width});
  std::vector<Tensor> accs2;
  std::vector<cuda::DeviceTensor> daccs2;
  std::vector<int64_t> h2(S), d2(S);
  for (size_t k = 0, i0 = 0; k < qs.size(); i0 += qs[k], ++k) {
    accs2.push_back(Tensor::copy_of(accs[k], Device::cpu));
    daccs2.push_back(upload(accs2.back()));
    for (int64_t t = 0; t < qs[k]; ++t) h2[i0 + t] = addr(accs2.back()), d2[i0 + t] = addr(daccs2.back());
  }
  ops::step_compressor(
      cpu::context(), {i64(h2), kv, gate, ape, i64(pos), ratio, overlap, width, emitted, i64(firsts), max_q});
  auto dem = poisoned(DType::f32, {S, width});
  auto dacc2 = upload(i64(d2));
  ops::step_compressor(cuda::context(),
                       {dacc2, dkv, dgate, dape, dpos, ratio, overlap, width, dem, dfirsts, max_q});
  for (int64_t i = 0; i < S; ++i)
    if ((pos[i] + 1) % ratio == 0)
      expect_close(dem.view().rows(i, i + 1), emitted.view().rows(i, i + 1), kTolF32,
                   cat(name, " emitted at slot ", i, " (position ", pos[i], ")"));
}

TEST(GpuStepOps, CompressSequencesOfSeveralTokens) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  check_compress_sequences(4, true, 512, r, "csa");
  check_compress_sequences(4, true, 128, r, "csa indexer keys");
  check_compress_sequences(128, false, 512, r, "hca");
  cuda::register_backend().check_device_errors();
}

TEST(GpuStepOps, IndexerTopk) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const int64_t H = 64, dim = 128, rows_per_page = 64;
  const int topk = 512, ratio = 4;
  const std::vector<int64_t> positions = {2100, 4095, 1000, 2, -1, 3, 2047, -1};
  const int64_t S = static_cast<int64_t>(positions.size());
  Tensor q = random_f32({S, H, dim}, r), w = random_f32({S, H}, r);
  std::vector<PagedPair> keys;
  std::vector<int64_t> nk(S), hp(S), ht(S), dp(S), dt(S);
  int64_t max_keys = 1;
  for (int64_t i = 0; i < S; ++i) {
    nk[i] = positions[i] < 0 ? 0 : (positions[i] + 1) / ratio;
    max_keys = std::max(max_keys, nk[i]);
    keys.push_back(paged_pair(random_f32({std::max<int64_t>(1, nk[i]), dim}, r), rows_per_page, r));
    const bool null_slot = positions[i] < 0 && i == S - 1;
    hp[i] = null_slot ? 0 : addr(keys[i].host_pool);
    ht[i] = null_slot ? 0 : addr(keys[i].host_table);
    dp[i] = null_slot ? 0 : addr(keys[i].device_pool);
    dt[i] = null_slot ? 0 : addr(keys[i].device_table);
  }
  const PagedRows& geo = keys[0].host;
  const Tensor pos = i64(positions), hpools = i64(hp), htables = i64(ht);
  ops::StepIndexerArgs a;
  a.q = q;
  a.weights = w;
  a.keys = {hpools, htables, geo.page_bytes(), geo.offset_in_page, rows_per_page, dim * 4};
  a.positions = pos;
  a.ratio = ratio;
  a.max_keys = max_keys;
  Tensor idx(DType::i32, {S, topk});
  ops::step_indexer_topk(cpu::context(), a, topk, idx);
  auto dq = upload(q), dw = upload(w), dpos = upload(pos), dpools = upload(i64(dp)),
       dtables = upload(i64(dt));
  ops::StepIndexerArgs da = a;
  da.q = dq;
  da.weights = dw;
  da.keys.pools = dpools;
  da.keys.tables = dtables;
  da.positions = dpos;
  auto didx = poisoned(DType::i32, {S, topk});
  ops::step_indexer_topk(cuda::context(), da, topk, didx);
  const Tensor got = cuda::to_host(didx);
  // Same picks, except where two scores are within f32 noise of each other (scores: the CPU's eager op).
  int64_t mismatched = 0;
  for (int64_t i = 0; i < S; ++i) {
    Tensor scores(DType::f32, {1, nk[i]});
    if (positions[i] >= 0 && nk[i] > 0)
      ops::indexer_scores(cpu::context(),
                          {q.view().rows(i, i + 1), w.view().rows(i, i + 1), keys[i].host, nk[i],
                           pos.view().rows(i, i + 1), ratio},
                          scores);
    for (int64_t j = 0; j < topk; ++j) {
      const int32_t want = idx.data<int32_t>()[i * topk + j], have = got.data<int32_t>()[i * topk + j];
      if (want == have) continue;
      const float* sc = scores.data<float>();
      if (want < 0 || have < 0 || have >= nk[i] ||
          std::fabs(sc[want] - sc[have]) > 1e-5f * std::fabs(sc[want]) + 1e-7f)
        ++mismatched;
    }
  }
  EXPECT_EQ(mismatched, 0) << "step_indexer_topk";
  std::printf("  step_indexer_topk: %lld mismatches\n", static_cast<long long>(mismatched));
  // The top-k's short ways (rows of at most topk keys: 250 and 512 here; sorts in registers) against the radix
  // select and the shared-memory sort: the same picks, bit for bit.
  {
    gputest::KnobGuard slow("TERN_TOPK_FAST", 0);
    auto slow_idx = poisoned(DType::i32, {S, topk});
    ops::step_indexer_topk(cuda::context(), da, topk, slow_idx);
    const Tensor want = cuda::to_host(slow_idx);
    EXPECT_EQ(std::memcmp(want.data<int32_t>(), got.data<int32_t>(), S * topk * sizeof(int32_t)), 0)
        << "step_indexer_topk: the short ways moved a pick";
  }
  cuda::register_backend().check_device_errors();
}

TEST(GpuStepOps, StoreRingRows) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const int64_t window = 128, rb = ops::KvRowFormat{ops::KvFormat::fp8_ds, 512, 64}.row_bytes();
  const std::vector<int64_t> positions = {0, 127, 128, 5000, -1, 64, -1};
  const int64_t S = static_cast<int64_t>(positions.size());
  Tensor rows(DType::u8, {S, rb});
  random_bytes(rows, r);
  std::vector<Tensor> rings(S);
  std::vector<cuda::DeviceTensor> drings(S);
  std::vector<int64_t> ha(S), da(S);
  for (int64_t i = 0; i < S; ++i) {
    rings[i] = Tensor(DType::u8, {window, rb});
    random_bytes(rings[i], r);
    drings[i] = upload(rings[i]);
    const bool null_slot = positions[i] < 0 && i == S - 1;
    ha[i] = null_slot ? 0 : addr(rings[i]);
    da[i] = null_slot ? 0 : addr(drings[i]);
  }
  const Tensor pos = i64(positions);
  ops::store_ring_rows(cpu::context(), rows, i64(ha), pos, {}, window);
  auto drows = upload(rows), dpos = upload(pos), dtab = upload(i64(da));
  ops::store_ring_rows(cuda::context(), drows, dtab, dpos, {}, window);
  for (int64_t i = 0; i < S; ++i)
    EXPECT_TRUE(same_bytes(rings[i], drings[i])) << "store_ring_rows: slot " << i << " at " << positions[i];
  cuda::register_backend().check_device_errors();
}

TEST(GpuStepOps, StorePagedRows) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const int64_t fp8 = ops::KvRowFormat{ops::KvFormat::fp8_ds, 512, 64}.row_bytes();
  struct Case {
    int ratio;
    int64_t row_bytes;
    std::vector<int64_t> positions;
  };
  const Case cases[] = {{4, fp8, {3, 4, 2099, 4095, -1, 1000, -1}},
                        {4, 128 * 4, {3, 4, 2099, 4095, -1, 1000, -1}},
                        {128, fp8, {127, 128, 5119, -1, 300, -1}}};
  for (const Case& c : cases) {
    const int64_t S = static_cast<int64_t>(c.positions.size()), rpp = 64;
    Tensor rows(DType::u8, {S, c.row_bytes});
    random_bytes(rows, r);
    std::vector<PagedPair> dest;
    std::vector<int64_t> hp(S), ht(S), dp(S), dt(S);
    for (int64_t i = 0; i < S; ++i) {
      Tensor old(DType::u8, {std::max<int64_t>(1, c.positions[i] / c.ratio + 1), c.row_bytes});
      random_bytes(old, r);
      dest.push_back(paged_pair(old, rpp, r));
      const bool null_slot = c.positions[i] < 0 && i == S - 1;
      hp[i] = null_slot ? 0 : addr(dest[i].host_pool);
      ht[i] = null_slot ? 0 : addr(dest[i].host_table);
      dp[i] = null_slot ? 0 : addr(dest[i].device_pool);
      dt[i] = null_slot ? 0 : addr(dest[i].device_table);
    }
    const PagedRows& geo = dest[0].host;
    const Tensor pos = i64(c.positions), hpools = i64(hp), htables = i64(ht);
    ops::store_paged_rows(cpu::context(), rows,
                          {hpools, htables, geo.page_bytes(), geo.offset_in_page, rpp, c.row_bytes}, pos,
                          c.ratio);
    auto drows = upload(rows), dpos = upload(pos), dpools = upload(i64(dp)), dtables = upload(i64(dt));
    ops::store_paged_rows(cuda::context(), drows,
                          {dpools, dtables, geo.page_bytes(), geo.offset_in_page, rpp, c.row_bytes}, dpos,
                          c.ratio);
    for (int64_t i = 0; i < S; ++i)
      EXPECT_TRUE(same_bytes(dest[i].host_pool, dest[i].device_pool))
          << "store_paged_rows ratio " << c.ratio << ": slot " << i << " at " << c.positions[i];
  }
  cuda::register_backend().check_device_errors();
}

}  // namespace
}  // namespace tern::gputest
