// The small-T linear path's plans (host code; the kernel is linear_small_impl.cuh): which panels, K segments,
// warps and rings a product gets, from a rough time model, or forced by name (TERN_LINEAR_SMALL_PLAN,
// set_linear_small_plan) so that a benchmark can measure every candidate. No plan changes a result's bits.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cuda/kernels/linear_small_impl.cuh"

namespace tern::cuda {

int64_t stream_chunks_per_group(const LinearParams& p);  // linear.cu: the K groups every streamed kernel shares

namespace {

// The time model's machine (H200 figures from docs/results.md; only the ranking of plans matters).
constexpr double kHbm = 4.2e6;         // bytes per us, the copy rate
constexpr double kL2 = 9.0e6;          // bytes per us into the multiprocessors from L2 (x, partial sums): a guess
constexpr double kSmShare = 1.6;       // one multiprocessor pulls at most this times its fair share of kHbm
constexpr double kLatency = 1.0;       // us, a loaded DRAM round trip (bytes in flight / this = a rate)
constexpr double kFirstBytes = 0.8;    // us from launch to the first weight bytes
constexpr double kClock = 1755.0;      // cycles per us under load
constexpr double kMmaLatency = 35.0;   // cycles between dependent mma.sync (a group's chain)
constexpr double kBulkCopy = 8.0;      // cycles of a multiprocessor's copy unit per cp.async.bulk: a guess, which the
                                       // benchmark's bulk / lsu rows test (linear_bulk's 192-byte copies were slow)
constexpr int kSmemPerSm = 227 * 1024;

std::string g_forced;  // set_linear_small_plan / TERN_LINEAR_SMALL_PLAN: a plan name, or empty
std::once_flag g_forced_env;
std::mutex g_forced_mu;

std::string forced_plan() {
  std::call_once(g_forced_env, [] {
    const char* e = std::getenv("TERN_LINEAR_SMALL_PLAN");
    if (e != nullptr) g_forced = e;
  });
  std::lock_guard<std::mutex> lock(g_forced_mu);
  return g_forced;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes between two rows of a ring stage holding `sc` chunks: a quarter-warp's A loads read rows g and g + 1 at
// the same lane offsets, so the stride must not be a multiple of 128 (FP8: == 64 mod 128 for its 16-byte lane
// runs; bf16: == 16 for its 32-byte ones), as linear_bulk pads.
int row_stride_of(bool fp8, int sc) {
  int st = sc * (fp8 ? 64 : 128);
  const int want = fp8 ? 64 : 16;
  while (st % 128 != want) st += 16;
  return st;
}

// Registers a thread of the kernel takes (a guess for the occupancy model; ptxas prints the real ones).
int regs_guess(int nt, bool fp8) { return nt == 1 ? (fp8 ? 64 : 90) : nt == 2 ? 98 : nt == 4 ? 110 : 168; }

struct Shape {
  bool fp8;
  int64_t out, in, T, nchunks, cpg, ngroups, rows_per_group;
  int nt, nlive, num_sms;
  bool xw;          // linear_x_window_kernel makes x's windows for this T (window plans read them)
  bool workspace;   // partial sums and counters available for several segments
};

// Fills the ring and the layout of plan `pl` (rm, mw, kw, ks, window set) within `limit` bytes of shared
// memory; false when it does not fit.
bool lay_out(const Shape& s, SmallLinearPlan& pl, int limit) {
  const int W = pl.warps();
  const int64_t seg_chunks = std::min(s.nchunks, pl.ks * s.cpg);
  const int nchw = static_cast<int>((pl.ks / pl.kw) * s.cpg);  // chunks per warp (at most)
  pl.win_chunks = pl.window ? static_cast<int>(seg_chunks) : 0;
  const int win = pl.window ? dev::XWindow<dev::WFmt::fp8>::bytes(8 * s.nlive, pl.win_chunks * 64) : 0;
  pl.scale_words = s.fp8 ? static_cast<int>(seg_chunks * 64 / 128 + 2) : 0;
  const int tab = (pl.scale_words * 4 + 15) / 16 * 16;
  const int fold = pl.kw > 1 ? pl.mw * pl.ks * 32 * pl.nt * 16 : 0;
  const int fixed = win + tab + fold;
  auto fits = [&](int st, int sc) {
    const int ring = st * pl.rm * row_stride_of(s.fp8, sc);
    return fixed + W * (ring + st * 8) <= limit;
  };
  // Everything the warp multiplies in flight at once when it fits (2 stages: the first half is multiplied
  // while the second lands), else a streaming ring of 4 (3 in flight) or 3 stages of the longest rows that fit.
  int st = 0, sc = 0;
  for (int cand : {2, 1, 3, 4}) {
    const int c = static_cast<int>(ceil_div(nchw, cand));
    if (cand <= nchw && fits(cand, c)) {
      st = cand, sc = c;
      break;
    }
  }
  if (st == 0) {
    for (int cand : {4, 3}) {
      int c = 0;
      while (c < nchw && fits(cand, c + 1)) ++c;
      if (c >= 1) {
        st = cand, sc = c;
        break;
      }
    }
  }
  if (st == 0) return false;
  pl.stages = st, pl.sc = sc, pl.row_stride = row_stride_of(s.fp8, sc);
  pl.ring_bytes = st * pl.rm * pl.row_stride;
  pl.win_off = W * pl.ring_bytes;
  pl.tab_off = pl.win_off + (win + 15) / 16 * 16;
  pl.fold_off = pl.tab_off + tab;
  pl.bar_off = pl.fold_off + fold;
  pl.smem = static_cast<size_t>(pl.bar_off) + static_cast<size_t>(W) * st * 8;
  return true;
}

// The model: weight bytes at the rate the busiest multiprocessor can pull (its share, the bytes it keeps in
// flight) or the card's, its instructions and MMAs, x from L2, the split-K round trip, the last group's chain.
double model_us(const Shape& s, const SmallLinearPlan& pl, int bps) {
  const int W = pl.warps(), cb = s.fp8 ? 64 : 128;
  const int64_t blocks = pl.panels * pl.segs;
  const int64_t seg_chunks = std::min(s.nchunks, pl.ks * s.cpg);
  const double rows = static_cast<double>(std::min<int64_t>(pl.rm * pl.mw, s.out));
  const double bb = rows * static_cast<double>(seg_chunks * cb);  // weight bytes of a block
  const double total = static_cast<double>(s.out) * static_cast<double>(s.nchunks * cb);
  const int64_t per_sm = ceil_div(blocks, s.num_sms);
  const int64_t resident = std::min<int64_t>(bps, per_sm);
  const int64_t waves = ceil_div(blocks, static_cast<int64_t>(s.num_sms) * bps);
  const int nchw = static_cast<int>((pl.ks / pl.kw) * s.cpg);
  const bool all_in = static_cast<int64_t>(pl.stages) * pl.sc >= nchw;
  const double in_flight = all_in ? bb : static_cast<double>(W) * (pl.stages - 1) * pl.rm * pl.sc * cb;
  const double rate = std::min(kSmShare * kHbm / s.num_sms, static_cast<double>(resident) * in_flight / kLatency);
  const double copies = pl.lsu ? 0.0 : static_cast<double>(per_sm) * bb / (pl.sc * cb);
  // With room for as many blocks again on each multiprocessor, the next kernel's blocks are placed beside these
  // (PDL) and most of its first-bytes latency hides behind this one's tail.
  const double first = per_sm * 2 <= bps ? 0.3 : kFirstBytes;
  const double t_mem = std::max({total / kHbm, static_cast<double>(per_sm) * bb / rate, copies * kBulkCopy / kClock}) +
                       first + 0.5 * static_cast<double>(waves - 1);
  // Issue: A loads and the FP8 decode per chunk, then per live n-tile the x loads (4 float4 + 8 packs direct,
  // 2 lds128 from the window) and 4 MMAs.
  const double decode = s.fp8 ? (pl.rm == 16 ? 66.0 : 33.0) : (pl.rm == 16 ? 4.0 : 2.0);
  const double per_tile = pl.window ? 6.0 : 16.0;
  const double chunks = static_cast<double>(per_sm) * W * nchw;
  const double copy_issue = pl.lsu ? pl.rm * cb / 16.0 / 32.0 * 8.0 : 0.0;  // lane copies: ~8 instructions a 512 B
  const double issue = chunks * (decode + 14.0 + copy_issue + per_tile * s.nlive) / 2.0;
  const double mma = chunks * 4.0 * s.nlive / 0.5;
  const double t_comp = std::max(issue, mma) / kClock;
  const double kseg_cols = static_cast<double>(seg_chunks * 64);
  double t_x = pl.window ? static_cast<double>(blocks) * 8 * s.nlive * kseg_cols * 2 / kL2
                         : static_cast<double>(blocks) * static_cast<double>(s.T) * kseg_cols * 4 / kL2;
  if (pl.window && s.xw) t_x += 1.5 + static_cast<double>(s.T * s.in) * 6 / kL2;  // the x window kernel
  const double t_fold = pl.segs > 1 ? 1.2 + 2.0 * static_cast<double>(s.ngroups * s.T * s.out) * 4 / kL2 : 0.0;
  const double t_tail = (all_in ? nchw : pl.sc) * 4.0 * kMmaLatency / kClock;
  return std::max(t_mem, t_comp) + t_x + t_fold + t_tail;
}

Shape shape_of(const LinearParams& p) {
  Shape s{};
  s.fp8 = p.w.kind == WeightKind::fp8;
  s.out = p.w.out, s.in = p.w.in, s.T = p.T;
  s.nchunks = p.w.in / 64;
  s.cpg = stream_chunks_per_group(p);
  s.ngroups = ceil_div(s.nchunks, s.cpg);
  s.rows_per_group = p.rows_per_group;
  s.nt = p.T <= 8 ? 1 : p.T <= 16 ? 2 : p.T <= 32 ? 4 : 8;
  s.nlive = static_cast<int>(ceil_div(p.T, 8));
  s.num_sms = p.num_sms;
  s.xw = p.T > 8;
  s.workspace = p.partial != nullptr && p.counters != nullptr &&
                s.ngroups * p.T * p.w.out <= p.partial_floats;
  return s;
}

// Every plan the kernel can run for this product (shape-valid, fitting shared memory), with the model's time.
std::vector<SmallLinearPlan> candidates(const LinearParams& p) {
  std::vector<SmallLinearPlan> out;
  if (p.T < 1 || p.T > 64) return out;
  const Shape s = shape_of(p);
  std::vector<int64_t> kss;
  for (int64_t k = 1; k < s.ngroups; k *= 2) kss.push_back(k);
  kss.push_back(s.ngroups);
  for (int rm : {8, 16}) {
    if (rm == 8 && s.nt != 1) continue;  // more tokens: 16-row m-tiles share each x fragment over twice the rows
    for (int mw = 1; mw * rm <= 128; mw *= 2) {
      const int R = rm * mw;
      if (s.rows_per_group != s.out && s.rows_per_group % R != 0) continue;
      for (const int64_t ks : kss) {
        const int64_t segs = ceil_div(s.ngroups, ks);
        const int64_t panels = ceil_div(s.out, R);
        if (segs > 1 && (!s.workspace || panels > p.num_counters)) continue;  // no room for the split
        for (int kw = 1; kw <= ks && mw * kw <= dev::small_max_warps(s.nt); kw *= 2) {
          if (ks % kw != 0) continue;
          for (int mode = 0; mode < 4; ++mode) {
            const bool window = mode & 1, lsu = mode & 2;
            if (window != (s.nt >= 4) && s.nt != 2) continue;  // direct x at 1-8 tokens, a window from 17
            SmallLinearPlan pl;
            pl.nt = s.nt, pl.rm = rm, pl.mw = mw, pl.kw = kw, pl.ks = static_cast<int>(ks), pl.window = window;
            pl.lsu = lsu;
            pl.cpg = s.cpg, pl.ngroups = s.ngroups, pl.panels = panels, pl.segs = segs;
            // Shared memory for as many blocks per multiprocessor as the grid wants there (at most 4), else fewer.
            const int64_t want = std::clamp<int64_t>(ceil_div(panels * segs, s.num_sms), 1, 4);
            bool placed = false;
            for (int64_t bps = want; bps >= 1 && !placed; --bps) {
              const int limit = std::min<int>(dev::kSmallMaxSmem, static_cast<int>(kSmemPerSm / bps) - 1024);
              if (!lay_out(s, pl, limit)) continue;
              const int64_t by_threads = 2048 / (pl.warps() * 32);
              const int64_t by_regs = 65536 / (pl.warps() * 32 * regs_guess(s.nt, s.fp8));
              const int64_t by_smem = kSmemPerSm / static_cast<int64_t>(pl.smem + 1024);
              const int64_t res = std::max<int64_t>(1, std::min({by_threads, by_regs, by_smem}));
              pl.model_us = model_us(s, pl, static_cast<int>(res));
              placed = true;
            }
            if (placed) out.push_back(pl);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

std::string small_plan_name(const SmallLinearPlan& pl) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "rm%d mw%d ks%d kw%d %s %s", pl.rm, pl.mw, pl.ks, pl.kw, pl.window ? "win" : "direct",
                pl.lsu ? "lsu" : "bulk");
  return buf;
}

// The plans are cached per (shape, T, workspace, forced name): the enumeration is too slow for every call of
// an eager step. panels == 0: no plan.
SmallLinearPlan plan_linear_small(const LinearParams& p) {
  const std::string forced = forced_plan();
  const Shape s = shape_of(p);
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, std::string>;
  const Key key{static_cast<int>(p.w.kind), p.w.out, p.w.in, p.rows_per_group, p.T, s.cpg, p.num_sms, s.workspace,
                forced};
  static std::mutex mu;
  static std::map<Key, SmallLinearPlan> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const std::vector<SmallLinearPlan> all = candidates(p);
  SmallLinearPlan best;
  if (!all.empty()) {
    best = *std::min_element(all.begin(), all.end(), [](const SmallLinearPlan& a, const SmallLinearPlan& b) {
      return a.model_us < b.model_us;
    });
    for (const SmallLinearPlan& pl : all)
      if (!forced.empty() && small_plan_name(pl) == forced) best = pl;
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, best);
  return best;
}

bool linear_small_ok(const LinearParams& p) {
  if (p.w.kind != WeightKind::fp8 && p.w.kind != WeightKind::bf16) return false;
  if (!linear_mma_ok(p) || p.T < 1 || p.T > 64) return false;
  if (p.rows_per_group != p.w.out && p.rows_per_group % 8 != 0) return false;
  return plan_linear_small(p).panels > 0;
}

std::vector<SmallPlanInfo> linear_small_plans(const LinearParams& p, int most) {
  std::vector<SmallLinearPlan> all = candidates(p);
  std::stable_sort(all.begin(), all.end(),
                   [](const SmallLinearPlan& a, const SmallLinearPlan& b) { return a.model_us < b.model_us; });
  std::vector<SmallPlanInfo> out;
  for (const SmallLinearPlan& pl : all) {
    if (static_cast<int>(out.size()) >= most) break;
    out.push_back({small_plan_name(pl), pl.panels, pl.segs, pl.warps(), pl.model_us});
  }
  return out;
}

void set_linear_small_plan(const std::string& name) {
  forced_plan();  // the environment is read once, before any override
  std::lock_guard<std::mutex> lock(g_forced_mu);
  g_forced = name;
}

std::string linear_small_plan_used(const LinearParams& p) {
  const SmallLinearPlan pl = plan_linear_small(p);
  if (pl.panels == 0) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s, %d warps, %lld x %lld blocks, ring %d x %d chunks, model %.1f us",
                small_plan_name(pl).c_str(), pl.warps(), static_cast<long long>(pl.panels),
                static_cast<long long>(pl.segs), pl.stages, pl.sc, pl.model_us);
  return buf;
}

}  // namespace tern::cuda
