// GPU vs CPU: the DeepSeek-V4 ops (mHC, compressor, indexer, sparse attention, routing, experts).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/kernels/moe.cuh"
#include "gpu_test_util.h"
#include "ops/attention.h"
#include "ops/branch.h"
#include "ops/compressor.h"
#include "ops/elementwise.h"
#include "ops/indexer.h"
#include "ops/kv_row.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "shapes.h"

namespace tern::gputest {
namespace {

class GpuV4 : public ::testing::TestWithParam<Shapes> {};

TEST_P(GpuV4, Mhc) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t hc = 4, mix = (2 + hc) * hc;
  // T = 1, 9 and 64: one partial token group of the mix kernel, two, eight full ones; 2 and 3: 4 and 2 warps
  // a token (3: two idle warps); 600: the library path (a cuBLAS mix; the folded hc_post with the mix's
  // squares column in one kernel, hc_post_squares, against hc_post and hc_squares).
  const int64_t library = cuda::CudaBackend::library_min_tokens();
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{9}, int64_t{64}, library + 88}) {
    Tensor streams = random_f32({T, hc, s.D}, r, 2.0f);
    Tensor fn = random_f32({mix, hc * s.D}, r, 0.02f), base = random_f32({mix}, r, 0.5f);
    Tensor scale = random_f32({3}, r, 0.5f);
    Tensor post(DType::f32, {T, hc}), comb(DType::f32, {T, hc, hc}), collapsed(DType::f32, {T, s.D});
    ops::HcPreArgs a{streams, fn, base, scale, {}, post, comb, collapsed};
    ops::hc_pre(cpu::context(), a);
    auto ds = upload(streams), dfn = upload(fn), db = upload(base), dsc = upload(scale);
    auto dpost = poisoned(DType::f32, {T, hc}), dcomb = poisoned(DType::f32, {T, hc, hc});
    auto dcol = poisoned(DType::f32, {T, s.D});
    ops::hc_pre(cuda::context(), ops::HcPreArgs{ds, dfn, db, dsc, {}, dpost, dcomb, dcol});
    expect_close(dpost, post, kTolF32, cat("hc_pre post T=", T));
    expect_close(dcomb, comb, 1e-4, cat("hc_pre comb (Sinkhorn) T=", T));
    expect_close(dcol, collapsed, kTolF32, cat("hc_pre collapsed T=", T));

    // With the sub-layer's norm in the same op (bf16 and f32 weights, as checkpoints have either).
    for (DType wt : {DType::bf16, DType::f32}) {
      Tensor norm = wt == DType::bf16 ? random_bf16({s.D}, r) : random_f32({s.D}, r);
      Tensor normed(DType::f32, {T, s.D});
      ops::HcPreArgs na = a;
      na.collapsed = normed;
      na.normed = true;
      na.norm = norm;
      na.rms_eps = 1e-5f;
      ops::hc_pre(cpu::context(), na);
      auto dnorm = upload(norm), dnormed = poisoned(DType::f32, {T, s.D});
      auto dpost2 = poisoned(DType::f32, {T, hc}), dcomb2 = poisoned(DType::f32, {T, hc, hc});
      ops::HcPreArgs dna{ds, dfn, db, dsc, {}, dpost2, dcomb2, dnormed, true, dnorm, 1e-5f};
      ops::hc_pre(cuda::context(), dna);
      expect_close(dnormed, normed, kTolF32, cat("hc_pre + rms_norm (", dtype_name(wt), " weight) T=", T));
      expect_close(dcomb2, comb, 1e-4, cat("hc_pre + rms_norm comb T=", T));
    }

    // Batch invariance: the last token alone gives the same bits as in the batch (below the library path).
    if (T > 1 && T < library) {
      auto one = upload(streams.view().rows(T - 1, T));
      auto p1 = poisoned(DType::f32, {1, hc}), c1 = poisoned(DType::f32, {1, hc, hc});
      auto x1 = poisoned(DType::f32, {1, s.D});
      ops::hc_pre(cuda::context(), ops::HcPreArgs{one, dfn, db, dsc, {}, p1, c1, x1});
      const Tensor all_post = cuda::to_host(dpost), all_comb = cuda::to_host(dcomb), all_col = cuda::to_host(dcol);
      const Tensor one_post = cuda::to_host(p1), one_comb = cuda::to_host(c1), one_col = cuda::to_host(x1);
      EXPECT_EQ(std::memcmp(one_post.data<float>(), all_post.data<float>() + (T - 1) * hc, hc * 4), 0) << "post T=" << T;
      EXPECT_EQ(std::memcmp(one_comb.data<float>(), all_comb.data<float>() + (T - 1) * hc * hc, hc * hc * 4), 0)
          << "comb T=" << T;
      EXPECT_EQ(std::memcmp(one_col.data<float>(), all_col.data<float>() + (T - 1) * s.D, s.D * 4), 0)
          << "collapsed T=" << T;
    }

    // post and comb apart (ops::HcPreArgs::logits, then hc_comb: the model's form, hc_comb on a side branch):
    // the same bits as the one op on the GPU (both run post_and_comb_warp), the logits close to the CPU's.
    {
      Tensor logits(DType::f32, {T, mix});
      ops::HcPreArgs ca{streams, fn, base, scale, {}, {}, {}, collapsed};
      ca.logits = logits;
      ops::hc_pre(cpu::context(), ca);
      auto dlog = poisoned(DType::f32, {T, mix}), acol = poisoned(DType::f32, {T, s.D});
      auto apost = poisoned(DType::f32, {T, hc}), acomb = poisoned(DType::f32, {T, hc, hc});
      ops::HcPreArgs ga{ds, dfn, db, dsc, {}, {}, {}, acol};
      ga.logits = dlog;
      ops::hc_pre(cuda::context(), ga);
      ops::hc_comb(cuda::context(), {dlog, db, dsc, {}, apost, acomb});
      expect_close(dlog, logits, kTolF32, cat("hc_pre logits T=", T));
      const Tensor hp = cuda::to_host(dpost), hcm = cuda::to_host(dcomb), hcol = cuda::to_host(dcol);
      const Tensor ap = cuda::to_host(apost), acm = cuda::to_host(acomb), ac = cuda::to_host(acol);
      EXPECT_EQ(std::memcmp(ap.data<float>(), hp.data<float>(), ap.nbytes()), 0) << "apart post T=" << T;
      EXPECT_EQ(std::memcmp(acm.data<float>(), hcm.data<float>(), acm.nbytes()), 0) << "apart comb T=" << T;
      EXPECT_EQ(std::memcmp(ac.data<float>(), hcol.data<float>(), ac.nbytes()), 0) << "apart collapsed T=" << T;
    }

    Tensor sub = random_f32({T, s.D}, r), out(DType::f32, {T, hc, s.D});
    ops::hc_post(cpu::context(), streams, sub, post, comb, out);
    auto dsub = upload(sub), dout = poisoned(DType::f32, {T, hc, s.D});
    auto hpost = upload(post), hcomb = upload(comb);  // same post / comb on both sides
    ops::hc_post(cuda::context(), ds, dsub, hpost, hcomb, dout);
    expect_close(dout, out, kTolF32, cat("hc_post T=", T));

    // hc_post folded into the next hc_pre (ops::HcPreArgs::prev_*; the mix kernel computes the streams it reads):
    // the streams are hc_post's bits, and post / comb / collapsed those of hc_pre on them.
    {
      auto fstreams = poisoned(DType::f32, {T, hc, s.D}), fpost = poisoned(DType::f32, {T, hc}),
           fcomb = poisoned(DType::f32, {T, hc, hc}), fcol = poisoned(DType::f32, {T, s.D});
      ops::HcPreArgs fa{fstreams, dfn, db, dsc, {}, fpost, fcomb, fcol};
      fa.prev_streams = ds, fa.prev_a = dsub, fa.prev_post = hpost, fa.prev_comb = hcomb;
      ops::hc_pre(cuda::context(), fa);
      auto upost = poisoned(DType::f32, {T, hc}), ucomb = poisoned(DType::f32, {T, hc, hc}),
           ucol = poisoned(DType::f32, {T, s.D});
      ops::hc_pre(cuda::context(), ops::HcPreArgs{dout, dfn, db, dsc, {}, upost, ucomb, ucol});
      const auto same = [&](const TensorView& x, const TensorView& y, const char* what) {
        const Tensor hx = cuda::to_host(x), hy = cuda::to_host(y);
        EXPECT_EQ(std::memcmp(hx.data<float>(), hy.data<float>(), hx.nbytes()), 0)
            << "hc_post folded into hc_pre, T=" << T << ": " << what << " differs from the two ops'";
      };
      same(fstreams, dout, "streams");
      same(fpost, upost, "post");
      same(fcomb, ucomb, "comb");
      same(fcol, ucol, "collapsed");
    }

    Tensor hfn = random_f32({hc, hc * s.D}, r, 0.02f), hbase = random_f32({hc}, r), hscale = random_f32({1}, r);
    Tensor head(DType::f32, {T, s.D});
    ops::hc_head(cpu::context(), ops::HcHeadArgs{streams, hfn, hbase, hscale, {}, head});
    auto dhfn = upload(hfn), dhb = upload(hbase), dhs = upload(hscale), dhead = poisoned(DType::f32, {T, s.D});
    ops::hc_head(cuda::context(), ops::HcHeadArgs{ds, dhfn, dhb, dhs, {}, dhead});
    expect_close(dhead, head, kTolF32, cat("hc_head T=", T));
  }
}

// Runs the same chunks through the CPU and GPU compressor from an empty state, comparing the emitted
// entries and the pending accumulators after every chunk. stacked: kv and gate are the column ranges of one
// [n, 2C] tensor, as the model's stacked wkv + wgate product gives them (model/stacked.h).
void check_compressor(int ratio, bool overlap, int64_t width, const std::vector<int64_t>& chunks, Rand& r,
                      const std::string& name, bool stacked) {
  const int64_t C = width * (overlap ? 2 : 1), n_acc = overlap ? 2 : 1;
  Tensor acc(DType::f32, {n_acc, 3, width});
  auto dacc = upload(acc);
  Tensor ape = random_f32({ratio, C}, r);
  auto dape = upload(ape);
  int64_t pos = 0;
  for (int64_t n : chunks) {
    Tensor kv = random_f32({n, C}, r), gate = random_f32({n, C}, r, 2.0f), both = random_f32({n, 2 * C}, r, 2.0f);
    const TensorView hkv = stacked ? both.view().cols(0, C) : kv.view(),
                     hgate = stacked ? both.view().cols(C, 2 * C) : gate.view();
    const int64_t count = ops::compressor_emit_count(pos, n, ratio);
    Tensor emitted(DType::f32, {std::max<int64_t>(count, 1), width});
    ops::CompressorArgs a{acc, hkv, hgate, ape, pos, ratio, overlap, emitted};
    EXPECT_EQ(ops::compressor_update(cpu::context(), a), count);
    auto dkv = upload(kv), dgate = upload(gate), dboth = upload(both),
         dem = poisoned(DType::f32, {std::max<int64_t>(count, 1), width});
    const TensorView dk = stacked ? dboth.view().cols(0, C) : dkv.view(),
                     dg = stacked ? dboth.view().cols(C, 2 * C) : dgate.view();
    EXPECT_EQ(ops::compressor_update(cuda::context(),
                                     ops::CompressorArgs{dacc, dk, dg, dape, pos, ratio, overlap, dem}),
              count);
    if (count > 0) expect_close(dem.view().rows(0, count), emitted.view().rows(0, count), kTolF32,
                                cat(name, " emitted at ", pos, "+", n));
    const Tensor got = cuda::to_host(dacc);
    const Compare c = compare(dacc, acc);
    EXPECT_LE(c.rel_err, kTolF32) << name << ": accumulators after " << pos << "+" << n;
    (void)got;
    pos += n;
  }
}

TEST_P(GpuV4, Compressor) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  // 1000 and 2051: chunks with many windows between their first two and their last (the blocks z >= 1 of the
  // kernel), at both ratios.
  const std::vector<int64_t> chunks = {3, 1, 1, 2, 13, 1, 1, 1, 40, 7, 1, 300, 1, 1, 1000, 2051, 1};
  for (bool stacked : {false, true}) {
    const std::string how = stacked ? " (kv, gate stacked)" : "";
    check_compressor(static_cast<int>(s.csa_ratio), true, s.head_dim, chunks, r, "compressor csa" + how, stacked);
    check_compressor(static_cast<int>(s.csa_ratio), true, s.index_dim, chunks, r, "compressor csa indexer" + how,
                     stacked);
    check_compressor(static_cast<int>(s.hca_ratio), false, s.head_dim, chunks, r, "compressor hca" + how, stacked);
  }
}

TEST_P(GpuV4, Indexer) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t H = s.index_heads, dim = s.index_dim;
  // 3 keys; 4 x topk keys (the top-k row cached in shared memory); past the cache (read from L2), with
  // every key row from 1000 on a copy of an earlier one, so equal scores straddle the top-k boundary.
  const int64_t cached_keys = 32768;  // kIndexerTopkCachedKeys (kernels/indexer.cuh)
  for (int64_t ctx : {s.csa_ratio * 3 + 1, s.csa_ratio * s.index_topk * 4 + 3,
                      s.csa_ratio * (cached_keys + 40) + 2}) {
    const int64_t S = ctx / s.csa_ratio, n = 3;
    Tensor q = random_f32({n, H, dim}, r), w = random_f32({n, H}, r), keys = random_f32({S, dim}, r);
    if (S > cached_keys)
      for (int64_t j = 1000; j < S; ++j)
        std::memcpy(keys.data<float>() + j * dim, keys.data<float>() + (j % 1000) * dim, dim * sizeof(float));
    Tensor pos(DType::i64, {n});
    for (int64_t i = 0; i < n; ++i) pos.data<int64_t>()[i] = ctx - n + i;
    // The keys in shuffled pages (as the state pool holds them), 5 per page.
    const PagedPair paged = paged_pair(keys, 5, r);
    ops::IndexerArgs a{q, w, paged.host, S, pos, static_cast<int>(s.csa_ratio)};
    Tensor scores(DType::f32, {n, S});
    ops::indexer_scores(cpu::context(), a, scores);
    auto dq = upload(q), dw = upload(w), dpos = upload(pos);
    ops::IndexerArgs da{dq, dw, paged.device, S, dpos, static_cast<int>(s.csa_ratio)};
    auto dscores = poisoned(DType::f32, {n, S});
    ops::indexer_scores(cuda::context(), da, dscores);
    expect_close(dscores, scores, kTolF32, cat("indexer_scores keys=", S));

    const int topk = static_cast<int>(s.index_topk);
    Tensor idx(DType::i32, {n, topk});
    ops::indexer_topk(cpu::context(), a, topk, idx);
    auto didx = poisoned(DType::i32, {n, topk});
    ops::indexer_topk(cuda::context(), da, topk, didx);
    const Tensor got = cuda::to_host(didx);
    // Same picks, except where two scores are within f32 noise of each other.
    int64_t mismatched = 0;
    for (int64_t i = 0; i < n * topk; ++i) {
      const int32_t want = idx.data<int32_t>()[i], have = got.data<int32_t>()[i];
      if (want == have) continue;
      const int64_t row = i / topk;
      const float* sc = scores.data<float>() + row * S;
      if (want < 0 || have < 0 || have >= S || std::fabs(sc[want] - sc[have]) > 1e-5f * std::fabs(sc[want]) + 1e-7f)
        ++mismatched;
    }
    EXPECT_EQ(mismatched, 0) << "indexer_topk keys=" << S;
    std::printf("  %-48s %lld mismatches\n", cat("indexer_topk keys=", S).c_str(), static_cast<long long>(mismatched));
  }
}

TEST_P(GpuV4, SparseAttention) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  struct Case {
    const char* name;
    int ratio;
    bool select;
    int64_t start, n;
  };
  const int64_t W = s.window;
  const Case cases[] = {{"swa decode", 0, false, 5 * W + 3, 1},      {"swa prefill", 0, false, 0, W + 5},
                        {"hca decode", static_cast<int>(s.hca_ratio), false, 9 * s.hca_ratio + 7, 1},
                        {"hca chunk", static_cast<int>(s.hca_ratio), false, 3 * s.hca_ratio - 2, 5},
                        {"csa decode", static_cast<int>(s.csa_ratio), true, 4 * s.csa_ratio * s.index_topk + 1, 1},
                        {"csa chunk", static_cast<int>(s.csa_ratio), true, 2 * W + 1, 4}};
  for (ops::KvFormat kf : {ops::KvFormat::fp8_ds, ops::KvFormat::f32})
    for (const Case& c : cases) {
      const ops::KvRowFormat f{kf, s.head_dim, s.rope_dim};
      const int64_t rb = f.row_bytes(), n = c.n, end = c.start + n;
      auto pack = [&](int64_t rows) {
        Tensor x = random_f32({rows, s.head_dim}, r), packed(DType::u8, {rows, rb});
        ops::kv_pack(cpu::context(), x, f, packed);
        return packed;
      };
      Tensor q = random_f32({n, s.heads, s.head_dim}, r, 0.5f), sinks = random_f32({s.heads}, r);
      Tensor chunk = pack(n), ring = pack(W);
      const int64_t num_c = c.ratio > 0 ? end / c.ratio : 0;
      Tensor comp = pack(std::max<int64_t>(num_c, 1));
      Tensor sel;
      const int64_t k = c.select ? s.index_topk : 0;
      if (c.select) {
        sel = Tensor(DType::i32, {n, k});
        for (int64_t i = 0; i < n; ++i) {
          const int64_t vis = (c.start + i + 1) / c.ratio;
          std::vector<int32_t> all(vis);
          std::iota(all.begin(), all.end(), 0);
          for (int64_t j = 0; j < k; ++j) {
            if (j < vis) std::swap(all[j], all[j + r.index(vis - j)]);
            sel.data<int32_t>()[i * k + j] = j < vis && j % 7 != 3 ? all[j] : -1;  // some -1 picks too
          }
        }
      }
      // The compressed rows in shuffled pages (as the state pool holds them), 7 per page.
      const PagedPair paged = paged_pair(comp, 7, r);
      ops::AttentionArgs a{q, c.start, f, chunk, ring, W, c.ratio > 0 ? paged.host : PagedRows(), num_c, c.ratio,
                           c.select ? sel.view() : TensorView(), sinks, 1.0f / std::sqrt(float(s.head_dim))};
      Tensor ref(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cpu::context(), a, ref);
      auto dq = upload(q), dsink = upload(sinks), dchunk = upload(chunk), dring = upload(ring);
      cuda::DeviceTensor dsel = c.select ? upload(sel) : cuda::DeviceTensor();
      ops::AttentionArgs da = a;
      da.q = dq;
      da.chunk_rows = dchunk;
      da.ring = dring;
      da.compressed = c.ratio > 0 ? paged.device : PagedRows();
      da.selected = c.select ? dsel.view() : TensorView();
      da.sinks = dsink;
      auto out = poisoned(DType::f32, {n, s.heads, s.head_dim});
      ops::sparse_attention(cuda::context(), da, out);
      const bool mma = attention_on_tensor_cores(f, s.heads);
      expect_close(out, ref, mma ? kTolBf16 : kTolF32,
                   cat("attention ", c.name, " ", ops::kv_format_name(kf), mma ? " (tensor cores)" : " (f32)"));
    }
  cuda::register_backend().check_device_errors();
}

TEST_P(GpuV4, Routing) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t T = 37, E = s.experts, k = s.experts_per_token;
  Tensor logits = random_f32({T, E}, r, 3.0f), bias = random_f32({E}, r, 0.1f);
  Tensor idx(DType::i32, {T, k}), w(DType::f32, {T, k});
  // route_scored on both kernels (the register kernel, TERN_ROUTE_REGS=0 the shared-memory one) at 1, 37 and 64
  // tokens against the CPU: the same picks, and weights of the same bits on the two kernels. A second round draws
  // logits from four values, a zero bias and -0.0 beside +0.0, so every top-k has ties (the lower expert id wins).
  for (const bool ties : {false, true}) {
    if (ties) {
      for (int64_t i = 0; i < T * E; ++i) {
        const float v[4] = {-200.0f, 0.5f, 1.0f, 2.0f};  // -200: a score of 0
        logits.data<float>()[i] = v[r.index(4)];
      }
      for (int64_t e = 0; e < E; ++e) bias.data<float>()[e] = e % 2 == 0 ? 0.0f : -0.0f;
    }
    ops::route_scored(cpu::context(), logits, bias, 1.5f, idx, w);
    auto dl = upload(logits), db = upload(bias);
    for (const int64_t n : {int64_t{1}, T, int64_t{64}}) {
      const int64_t rows = std::min(n, T);
      Tensor by_kernel[2];
      for (const int regs : {1, 0}) {
        KnobGuard kernel("TERN_ROUTE_REGS", regs);
        auto didx = poisoned(DType::i32, {rows, k}), dw = poisoned(DType::f32, {rows, k});
        ops::route_scored(cuda::context(), dl.view().rows(0, rows), db, 1.5f, didx, dw);
        const Tensor got = cuda::to_host(didx);
        const std::string what = cat(regs ? "route_scored_regs_kernel" : "route_scored_kernel", ", ", rows,
                                     " tokens", ties ? ", ties" : "");
        EXPECT_EQ(std::memcmp(got.data<int32_t>(), idx.data<int32_t>(), rows * k * 4), 0) << what << ": picks differ";
        expect_close(dw, w.view().rows(0, rows), kTolF32, what + ": weights");
        by_kernel[regs] = cuda::to_host(dw);
      }
      EXPECT_EQ(std::memcmp(by_kernel[0].data<float>(), by_kernel[1].data<float>(), rows * k * 4), 0)
          << "the two route_scored kernels' weights differ at " << rows << " tokens";
    }
  }
  auto dl = upload(logits);

  Tensor tid2eid(DType::i64, {s.vocab, k}), tokens(DType::i64, {T});
  for (int64_t i = 0; i < s.vocab * k; ++i) tid2eid.data<int64_t>()[i] = r.index(E);
  for (int64_t t = 0; t < T; ++t) tokens.data<int64_t>()[t] = r.index(s.vocab);
  ops::route_hash(cpu::context(), logits, tid2eid, tokens, 1.5f, idx, w);
  auto dt = upload(tid2eid), dtok = upload(tokens);
  auto hidx = poisoned(DType::i32, {T, k}), hw = poisoned(DType::f32, {T, k});
  ops::route_hash(cuda::context(), dl, dt, dtok, 1.5f, hidx, hw);
  const Tensor got_h = cuda::to_host(hidx);
  EXPECT_EQ(std::memcmp(got_h.data<int32_t>(), idx.data<int32_t>(), T * k * 4), 0) << "route_hash picks differ";
  expect_close(hw, w, kTolF32, "route_hash weights");
  cuda::register_backend().check_device_errors();
}

TEST_P(GpuV4, MoeExperts) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  // The real width and depth; 16 experts stand for the 256 (the kernels do not depend on their number).
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4, ops::WeightFormat::fp8_block,
                              ops::WeightFormat::bf16, ops::WeightFormat::f32}) {
    if (f == ops::WeightFormat::f32 && D > 1024) continue;
    const RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& hexp = experts.on_host;
    const std::vector<ops::Expert>& dexp = experts.on_device;
    const bool fp4 = f == ops::WeightFormat::mxfp4 || f == ops::WeightFormat::nvfp4;
    // FP4: the bulk-copy kernels at 1, 3, 8, 16, 40 and 64 tokens (jobs of 1 to 8 pairs, experts split over
    // jobs, job changes inside a block while the other warp group still decodes the previous job),
    // and 100 tokens (several jobs an expert under the skewed routing below); every kernel variant (ring depth, warps, item size, padded stage
    // rows, counters for the bookkeeping, the register kernel forced) against the same reference. Other
    // formats: the register kernel.
    cuda::CudaBackend& be = cuda::register_backend();
    const int variants = fp4 ? cuda::CudaBackend::moe_variants() : 1;
    // The decode kernels at every T here (the bulk kernels up to 256 tokens), not the grouped ones from 65.
    const MoeGroupedMinTokensGuard decode_kernels(cuda::CudaBackend::library_min_tokens());
    for (int64_t T : fp4 ? std::vector<int64_t>{1, 3, 8, 16, 40, 64, 100} : std::vector<int64_t>{1, 16, 70}) {
      Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
      Tensor idx(DType::i32, {T, k});
      for (int64_t t = 0; t < T; ++t) {  // distinct experts per token, skewed towards the first ones
        std::vector<int32_t> all(E);
        std::iota(all.begin(), all.end(), 0);
        for (int64_t j = 0; j < k; ++j) std::swap(all[j], all[j + r.index(std::min<int64_t>(E - j, 4 + j))]);
        std::copy_n(all.begin(), k, idx.data<int32_t>() + t * k);
      }
      Tensor ref(DType::f32, {T, D});
      ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, hexp, 10.0f, ref});
      auto dx = upload(x), dw = upload(w), didx = upload(idx);
      for (int v = 0; v < variants; ++v) {
        be.set_moe_variant(v);
        const std::string path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat("moe_experts ", ops::weight_format_name(f), " T=", T, " variant ", v, " (",
                                     cuda::CudaBackend::moe_variant_name(v), "; ", path, ")");
        const bool bulk_expected =
            fp4 && T <= cuda::kMoeBulkMaxTokens && cuda::CudaBackend::moe_variant_name(v).starts_with("bulk");
        EXPECT_EQ(path.find("moe_bulk") != std::string::npos, bulk_expected) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        expect_close(out, ref, kTolBf16, what);
        if (T < 2) continue;
        // Batch invariance: tokens off..off+n-1 alone give the bits they got in the batch of T.
        const int64_t n = std::min<int64_t>(3, T - 1), off = r.index(T - n + 1);
        Tensor xs(DType::f32, {n, D}), ws(DType::f32, {n, k}), is(DType::i32, {n, k});
        std::memcpy(xs.data<float>(), x.data<float>() + off * D, n * D * 4);
        std::memcpy(ws.data<float>(), w.data<float>() + off * k, n * k * 4);
        std::memcpy(is.data<int32_t>(), idx.data<int32_t>() + off * k, n * k * 4);
        auto dxs = upload(xs), dws = upload(ws), dis = upload(is), outs = poisoned(DType::f32, {n, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dxs, dis, dws, dexp, 10.0f, outs});
        const Tensor all_h = cuda::to_host(out), part_h = cuda::to_host(outs);
        EXPECT_EQ(std::memcmp(part_h.data<float>(), all_h.data<float>() + off * D, n * D * 4), 0)
            << what << ": tokens " << off << ".." << off + n - 1 << " differ between a batch of " << n
            << " and the batch of " << T;
      }
      be.set_moe_variant(0);
    }
  }
  cuda::register_backend().check_device_errors();
}

// A shared output (the shared expert's, MoeExpertsArgs::shared) added in the combine: the bits of moe_experts then
// add, on every path the batch sizes reach (the bulk kernels, the grouped ones from 65 tokens, the register kernel of
// bf16 and f32 experts); and written by a side branch inside a captured step, where moe_experts joins the
// branch at its combine (a missing join fails the capture or reads y early): the replay equals the eager bits.
TEST_P(GpuV4, MoeSharedAddedInTheCombine) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::bf16, ops::WeightFormat::f32}) {
    if (f == ops::WeightFormat::f32 && D > 1024) continue;
    const RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& dexp = experts.on_device;
    for (int64_t T : {int64_t{1}, int64_t{16}, int64_t{100}}) {
      Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f), g = random_f32({T, D}, r),
             u = random_f32({T, D}, r);
      Tensor idx(DType::i32, {T, k});
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) idx.data<int32_t>()[t * k + j] = static_cast<int32_t>((t * 5 + j) % E);
      auto dx = upload(x), dw = upload(w), didx = upload(idx), dg = upload(g), du = upload(u);
      const std::string what = cat("moe_experts ", ops::weight_format_name(f), " T=", T, " (",
                                   be.moe_path(dexp[0].w1, T, k), ") with a shared output");
      auto y = poisoned(DType::f32, {T, D}), plain = poisoned(DType::f32, {T, D}), with = poisoned(DType::f32, {T, D});
      ops::swiglu(cuda::context(), dg, du, 1.5f, y);
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, plain});
      ops::add(cuda::context(), y, plain);  // what the model did before
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, with, y});
      const Tensor want = cuda::to_host(plain);
      EXPECT_EQ(std::memcmp(cuda::to_host(with).data<float>(), want.data<float>(), static_cast<size_t>(T * D) * 4), 0)
          << what << ": not the bits of moe_experts then add";

      // y from a side branch of a captured step (a second stream), read by the combine.
      auto ys = poisoned(DType::f32, {T, D}), replayed = poisoned(DType::f32, {T, D});
      be.synchronize();
      CapturedOps graph([&] {
        ops::run_side(cuda::context(), Device::cuda, [&] { ops::swiglu(cuda::context(), dg, du, 1.5f, ys); });
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, replayed, ys});
      });
      ASSERT_EQ(graph.error(), "") << what;
      ASSERT_EQ(graph.replay(), "") << what;
      EXPECT_EQ(std::memcmp(cuda::to_host(replayed).data<float>(), want.data<float>(), static_cast<size_t>(T * D) * 4),
                0)
          << what << ": a graph whose side branch writes the shared output differs from the eager bits";
    }
  }
  be.check_device_errors();
}

// moe_experts with its routing (MoeExpertsArgs::route), scored and hash, x as it is and FP8-quantised
// (--activations fp8): where launch_moe runs at up to 8 tokens the plan kernel routes and quantises x in its launch
// (moe_prep_kernel; with TERN_MOE_PREP_MAX_TOKENS at 64 up to 64 too); at 9-64 the routing runs alone and the plan in
// 256 threads; from 65 tokens the grouped kernels take the call. Every case gives
// the bits of the route op then moe_experts with TERN_MOE_FUSED_PLAN=0 (separate launches: route, act_fake_quant,
// moe_plan), eagerly, with h quantised in the down kernel's staging (TERN_MOE_STAGE_QUANT_H) and replayed from a
// graph; the picks equal the CPU's. The routing is over the shape's real expert count (V4-Flash: 256, every register
// slot of the routing kernel and the plan's scan over 256 threads), the experts 16 random ones repeated.
TEST_P(GpuV4, MoeRoutingInThePlanKernel) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = s.experts, k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  RandomExperts distinct(ops::WeightFormat::mxfp4, std::min<int64_t>(E, 16), D, inter, r);
  Tensor table(DType::i64, {s.vocab, k});
  for (int64_t v = 0; v < s.vocab; ++v)
    for (int64_t j = 0; j < k; ++j) table.data<int64_t>()[v * k + j] = (v + 3 * j) % E;  // distinct for k <= E / 3
  auto dtable = upload(table), dbias = upload(random_f32({E}, r, 0.1f));
  for (const bool fp8 : {false, true}) {
    for (ops::Expert& e : distinct.on_device) e.w1.act_fp8 = e.w2.act_fp8 = e.w3.act_fp8 = fp8;
    std::vector<ops::Expert> dexp;
    for (int64_t e = 0; e < E; ++e) dexp.push_back(distinct.on_device[e % distinct.on_device.size()]);
    for (const int64_t T : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{16}, int64_t{64}, int64_t{100}}) {
      Tensor x = random_f32({T, D}, r), logits = random_f32({T, E}, r, 3.0f), ids(DType::i64, {T});
      for (int64_t t = 0; t < T; ++t) ids.data<int64_t>()[t] = r.index(s.vocab);
      auto dx = upload(x), dl = upload(logits), dids = upload(ids);
      for (const bool hashed : {false, true}) {
        ops::MoeRouting route;
        route.logits = dl.view();
        route.routed_scale = 1.5f;
        if (hashed)
          route.tid2eid = dtable.view(), route.token_ids = dids.view();
        else
          route.bias = dbias.view();
        const std::string what = cat("moe_experts with ", hashed ? "hash" : "scored", " routing, T=", T,
                                     fp8 ? ", x FP8" : "", " (", be.moe_path(dexp[0].w1, T, k), ")");
        auto idx = poisoned(DType::i32, {T, k}), w = poisoned(DType::f32, {T, k}), want = poisoned(DType::f32, {T, D});
        {
          KnobGuard apart("TERN_MOE_FUSED_PLAN", 0);
          if (hashed)
            ops::route_hash(cuda::context(), dl, dtable, dids, 1.5f, idx, w);
          else
            ops::route_scored(cuda::context(), dl, dbias, 1.5f, idx, w);
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, idx, w, dexp, 10.0f, want});
        }
        const Tensor want_idx = cuda::to_host(idx), want_w = cuda::to_host(w), want_out = cuda::to_host(want);
        Tensor cpu_idx(DType::i32, {T, k}), cpu_w(DType::f32, {T, k});
        if (hashed)
          ops::route_hash(cpu::context(), logits, table, ids, 1.5f, cpu_idx, cpu_w);
        else
          ops::route_scored(cpu::context(), logits, cuda::to_host(dbias), 1.5f, cpu_idx, cpu_w);
        EXPECT_EQ(std::memcmp(want_idx.data<int32_t>(), cpu_idx.data<int32_t>(), T * k * 4), 0) << what << ": picks";
        const auto same = [&](const TensorView& gi, const TensorView& gw, const TensorView& go, const char* how) {
          EXPECT_EQ(std::memcmp(cuda::to_host(gi).data<int32_t>(), want_idx.data<int32_t>(), T * k * 4), 0)
              << what << ", " << how << ": picks differ";
          EXPECT_EQ(std::memcmp(cuda::to_host(gw).data<float>(), want_w.data<float>(), T * k * 4), 0)
              << what << ", " << how << ": weights differ";
          EXPECT_EQ(std::memcmp(cuda::to_host(go).data<float>(), want_out.data<float>(), T * D * 4), 0)
              << what << ", " << how << ": outputs differ";
        };
        for (const int fused : {1, 0}) {
          KnobGuard plan("TERN_MOE_FUSED_PLAN", fused);
          auto gi = poisoned(DType::i32, {T, k}), gw = poisoned(DType::f32, {T, k}), go = poisoned(DType::f32, {T, D});
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, gi, gw, dexp, 10.0f, go, {}, route});
          same(gi, gw, go, fused ? "eager, in the plan kernel" : "eager, apart");
        }
        {  // the plan kernel's bound raised to its most (TERN_MOE_PREP_MAX_TOKENS): 16 and 64 tokens route in it too
          KnobGuard bound("TERN_MOE_PREP_MAX_TOKENS", cuda::kMoeSmallPlanMaxTokens);
          auto gi = poisoned(DType::i32, {T, k}), gw = poisoned(DType::f32, {T, k}), go = poisoned(DType::f32, {T, D});
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, gi, gw, dexp, 10.0f, go, {}, route});
          same(gi, gw, go, "eager, in the plan kernel up to 64 tokens");
        }
        {  // h quantised in the down kernel's staging (TERN_MOE_STAGE_QUANT_H; fp8 only, up to 64 tokens)
          KnobGuard h_staged("TERN_MOE_STAGE_QUANT_H", 1);
          auto gi = poisoned(DType::i32, {T, k}), gw = poisoned(DType::f32, {T, k}), go = poisoned(DType::f32, {T, D});
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, gi, gw, dexp, 10.0f, go, {}, route});
          same(gi, gw, go, "eager, h quantised as staged");
        }
        auto gi = poisoned(DType::i32, {T, k}), gw = poisoned(DType::f32, {T, k}), go = poisoned(DType::f32, {T, D});
        be.synchronize();
        CapturedOps graph([&] {
          ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, gi, gw, dexp, 10.0f, go, {}, route});
        });
        ASSERT_EQ(graph.error(), "") << what;
        ASSERT_EQ(graph.replay(), "") << what;
        same(gi, gw, go, "replayed");
      }
    }
  }
  be.check_device_errors();
}

// The exact experts (--activations f32: every expert weight `exact`): f32 CUDA-core products, so the GPU is held to
// the f32 bound against the CPU, at this shape's width and depth and at the odd fixture's (hidden 320, width 96,
// 6 experts top-3), in every expert format.
TEST_P(GpuV4, MoeExpertsExact) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  struct Case {
    int64_t E, k, D, inter;
  };
  for (const Case c : {Case{std::min<int64_t>(s.experts, 16), s.experts_per_token, s.D, s.inter}, Case{6, 3, 320, 96}}) {
    for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4, ops::WeightFormat::fp8_block,
                                ops::WeightFormat::bf16}) {
      RandomExperts experts(f, c.E, c.D, c.inter, r);
      std::vector<ops::Expert> dexp = experts.on_device;
      for (ops::Expert& e : dexp) e.w1.exact = e.w2.exact = e.w3.exact = true;
      for (int64_t T : {1, 5}) {
        Tensor x = random_f32({T, c.D}, r), w = random_f32({T, c.k}, r, 0.5f);
        Tensor idx(DType::i32, {T, c.k});
        for (int64_t t = 0; t < T; ++t) {  // distinct experts per token
          std::vector<int32_t> all(c.E);
          std::iota(all.begin(), all.end(), 0);
          for (int64_t j = 0; j < c.k; ++j) std::swap(all[j], all[j + r.index(c.E - j)]);
          std::copy_n(all.begin(), c.k, idx.data<int32_t>() + t * c.k);
        }
        Tensor ref(DType::f32, {T, c.D});
        ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, experts.on_host, 10.0f, ref});
        auto dx = upload(x), dw = upload(w), didx = upload(idx), out = poisoned(DType::f32, {T, c.D});
        const std::string path = cuda::register_backend().moe_path(dexp[0].w1, T, c.k);
        EXPECT_NE(path.find("moe_exact"), std::string::npos) << path;
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        expect_close(out, ref, kTolF32,
                     cat("exact moe_experts ", ops::weight_format_name(f), " E=", c.E, " D=", c.D, " inter=", c.inter,
                         " T=", T));
      }
    }
  }
  cuda::register_backend().check_device_errors();
}

// Every expert-kernel variant takes its K slices from the weight shape alone (moe_k_slices) and adds each
// output's slices in slice order, chunks in column order: so every variant, the register kernel included,
// must give variant 0's bits, not merely bits close to the reference. This is what makes the variants 5-7 of
// session 9 (padded stage rows, counters for the bookkeeping) safe to make the default, and what batch
// invariance needs of the register kernel. A variant that changes the summation order must be left out here
// by name (and be kept away from serving). Fresh random data, V4-Flash's width and depth (and the fixture's).
TEST_P(GpuV4, MoeVariantsBitIdentical) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 16), k = s.experts_per_token, D = s.D, inter = s.inter;
  cuda::CudaBackend& be = cuda::register_backend();
  for (ops::WeightFormat f : {ops::WeightFormat::mxfp4, ops::WeightFormat::nvfp4}) {
    const RandomExperts experts(f, E, D, inter, r);
    const std::vector<ops::Expert>& dexp = experts.on_device;
    // The decode kernels at every T here (the bulk kernels up to 256 tokens), not the grouped ones from 65.
    const MoeGroupedMinTokensGuard decode_kernels(cuda::CudaBackend::library_min_tokens());
    for (int64_t T : {1, 5, 16, 64, 100}) {  // 100: the bulk kernels past 64 tokens (session 21)
      Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f);
      Tensor idx(DType::i32, {T, k});
      for (int64_t t = 0; t < T; ++t) {  // distinct experts per token, any of them
        std::vector<int32_t> all(E);
        std::iota(all.begin(), all.end(), 0);
        for (int64_t j = 0; j < k; ++j) std::swap(all[j], all[j + r.index(E - j)]);
        std::copy_n(all.begin(), k, idx.data<int32_t>() + t * k);
      }
      auto dx = upload(x), dw = upload(w), didx = upload(idx);
      be.set_moe_variant(0);
      auto base = poisoned(DType::f32, {T, D});
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, base});
      const Tensor base_h = cuda::to_host(base);
      for (int v = 1; v < cuda::CudaBackend::moe_variants(); ++v) {
        be.set_moe_variant(v);
        const std::string name = cuda::CudaBackend::moe_variant_name(v), path = be.moe_path(dexp[0].w1, T, k);
        const std::string what = cat("moe_experts ", ops::weight_format_name(f), " T=", T, " variant ", v, " (",
                                     name, "; ", path, ")");
        // The path names what ran: a variant's layout or bookkeeping never falls back silently.
        for (const char* feature : {"padded rows", "(not scales)", "counters"})
          EXPECT_EQ(path.find(feature) != std::string::npos, name.find(feature) != std::string::npos) << what;
        auto out = poisoned(DType::f32, {T, D});
        ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
        const Tensor out_h = cuda::to_host(out);
        int64_t differ = 0, at = -1;
        for (int64_t i = 0; i < T * D; ++i)
          if (std::memcmp(out_h.data<float>() + i, base_h.data<float>() + i, 4) != 0 && differ++ == 0) at = i;
        EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << T * D << " outputs differ from variant 0's bits"
                             << (at >= 0 ? cat(", first at token ", at / D, " column ", at % D) : std::string());
      }
      be.set_moe_variant(0);
    }
  }
  be.check_device_errors();
}

// The device table of expert pointers is cached per expert list: replacing a middle expert of the same list
// (the same host vector, the same first and last weights, as a new model at reused addresses can) must
// rebuild it. A table checked only at its ends kept pointing at the old expert (freed weights in the graph
// tests: NaN router scores).
TEST_P(GpuV4, MoeExpertTableFollowsItsExperts) {
  TERN_REQUIRE_GPU();
  const Shapes& s = GetParam();
  Rand r(fresh_seed());
  const int64_t E = std::min<int64_t>(s.experts, 8), k = std::min<int64_t>(s.experts_per_token, E), D = s.D,
                inter = s.inter, T = 4;
  const RandomExperts a(ops::WeightFormat::mxfp4, E, D, inter, r), b(ops::WeightFormat::mxfp4, E, D, inter, r);
  std::vector<ops::Expert> hexp = a.on_host, dexp = a.on_device;
  Tensor x = random_f32({T, D}, r), w = random_f32({T, k}, r, 0.5f), idx(DType::i32, {T, k});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) idx.data<int32_t>()[t * k + j] = static_cast<int32_t>((j + t) % E);
  auto dx = upload(x), dw = upload(w), didx = upload(idx);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) {  // expert 1 (tokens 0 and 1 pick it) becomes b's expert 1, in place
      hexp[1] = b.on_host[1];
      dexp[1] = b.on_device[1];
    }
    Tensor ref(DType::f32, {T, D});
    ops::moe_experts(cpu::context(), ops::MoeExpertsArgs{x, idx, w, hexp, 10.0f, ref});
    auto out = poisoned(DType::f32, {T, D});
    ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, dexp, 10.0f, out});
    expect_close(out, ref, kTolBf16, cat("moe_experts after ", round, " in-place expert swaps"));
  }
  cuda::register_backend().check_device_errors();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuV4, ::testing::Values(kFixture, kV4Flash), ShapeName());

}  // namespace
}  // namespace tern::gputest
