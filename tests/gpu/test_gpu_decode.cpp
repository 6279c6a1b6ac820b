// GPU vs CPU: the batched decode-step ops (ops/decode.h) other than attention (test_gpu_attention.cpp) at the
// V4-Flash shapes, each run on the CUDA backend (device address tables) and on the CPU backend's batched
// reference (host address tables) over the same random slots: several positions per batch, windows that
// close and ones that don't, inert slots (position -1; one with poisoned state that must stay untouched,
// one with 0 addresses).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "gpu_test_util.h"
#include "ops/compressor.h"
#include "ops/decode.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"

namespace tern::gputest {
namespace {

int64_t addr(const TensorView& t) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data()));
}
Tensor i64(const std::vector<int64_t>& v) {
  Tensor t(DType::i64, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}
void random_bytes(const TensorView& t, Rand& r) {
  for (size_t i = 0; i < t.nbytes(); ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(r.bits());
}
bool same_bytes(const TensorView& host, const TensorView& device) {
  const Tensor d = cuda::to_host(device);
  return host.nbytes() == d.nbytes() && std::memcmp(host.data(), d.view().data(), host.nbytes()) == 0;
}

void check_decode_compressor(int ratio, bool overlap, int64_t width, const std::vector<int64_t>& positions,
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
      ops::compressor_update({accs[i], pk, pg, ape, 0, ratio, overlap, em});
    }
    before[i] = Tensor::copy_of(accs[i], Device::cpu);
    daccs[i] = upload(accs[i]);
    const bool null_slot = p < 0 && i == S - 1;
    host_addr[i] = null_slot ? 0 : addr(accs[i]);
    dev_addr[i] = null_slot ? 0 : addr(daccs[i]);
  }
  const Tensor pos = i64(positions), hacc = i64(host_addr), dacc_t = i64(dev_addr);
  Tensor emitted(DType::f32, {S, width});
  ops::decode_compressor({hacc, kv, gate, ape, pos, ratio, overlap, width, emitted});
  auto dkv = upload(kv), dgate = upload(gate), dape = upload(ape), dpos = upload(pos), dtab = upload(dacc_t);
  auto dem = poisoned(DType::f32, {S, width});
  ops::decode_compressor({dtab, dkv, dgate, dape, dpos, ratio, overlap, width, dem});
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

TEST(GpuDecodeOps, Compressor) {
  TERN_REQUIRE_GPU();
  Rand r(fresh_seed());
  const std::vector<int64_t> pos4 = {0, 3, 6, 1003, -1, 1100, 2047, -1};
  check_decode_compressor(4, true, 512, pos4, r, "decode_compressor csa");
  check_decode_compressor(4, true, 128, pos4, r, "decode_compressor csa indexer");
  check_decode_compressor(128, false, 512, {5, 127, 255, -1, 300, 4095, -1}, r, "decode_compressor hca");
  cuda::register_backend().check_device_errors();
}

TEST(GpuDecodeOps, IndexerTopk) {
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
  ops::DecodeIndexerArgs a;
  a.q = q;
  a.weights = w;
  a.keys = {hpools, htables, geo.page_bytes(), geo.offset_in_page, rows_per_page, dim * 4};
  a.positions = pos;
  a.ratio = ratio;
  a.max_keys = max_keys;
  Tensor idx(DType::i32, {S, topk});
  ops::decode_indexer_topk(a, topk, idx);
  auto dq = upload(q), dw = upload(w), dpos = upload(pos), dpools = upload(i64(dp)),
       dtables = upload(i64(dt));
  ops::DecodeIndexerArgs da = a;
  da.q = dq;
  da.weights = dw;
  da.keys.pools = dpools;
  da.keys.tables = dtables;
  da.positions = dpos;
  auto didx = poisoned(DType::i32, {S, topk});
  ops::decode_indexer_topk(da, topk, didx);
  const Tensor got = cuda::to_host(didx);
  // Same picks, except where two scores are within f32 noise of each other (scores: the CPU's eager op).
  int64_t mismatched = 0;
  for (int64_t i = 0; i < S; ++i) {
    Tensor scores(DType::f32, {1, nk[i]});
    if (positions[i] >= 0 && nk[i] > 0)
      ops::indexer_scores({q.view().rows(i, i + 1), w.view().rows(i, i + 1), keys[i].host, nk[i],
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
  EXPECT_EQ(mismatched, 0) << "decode_indexer_topk";
  std::printf("  decode_indexer_topk: %lld mismatches\n", static_cast<long long>(mismatched));
  cuda::register_backend().check_device_errors();
}

TEST(GpuDecodeOps, StoreRingRows) {
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
  ops::store_ring_rows(rows, i64(ha), pos, window);
  auto drows = upload(rows), dpos = upload(pos), dtab = upload(i64(da));
  ops::store_ring_rows(drows, dtab, dpos, window);
  for (int64_t i = 0; i < S; ++i)
    EXPECT_TRUE(same_bytes(rings[i], drings[i])) << "store_ring_rows: slot " << i << " at " << positions[i];
  cuda::register_backend().check_device_errors();
}

TEST(GpuDecodeOps, StorePagedRows) {
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
    ops::store_paged_rows(rows, {hpools, htables, geo.page_bytes(), geo.offset_in_page, rpp, c.row_bytes},
                          pos, c.ratio);
    auto drows = upload(rows), dpos = upload(pos), dpools = upload(i64(dp)), dtables = upload(i64(dt));
    ops::store_paged_rows(drows, {dpools, dtables, geo.page_bytes(), geo.offset_in_page, rpp, c.row_bytes},
                          dpos, c.ratio);
    for (int64_t i = 0; i < S; ++i)
      EXPECT_TRUE(same_bytes(dest[i].host_pool, dest[i].device_pool))
          << "store_paged_rows ratio " << c.ratio << ": slot " << i << " at " << c.positions[i];
  }
  cuda::register_backend().check_device_errors();
}

}  // namespace
}  // namespace tern::gputest
