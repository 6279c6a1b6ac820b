// tern_gpu_bench --only moe_timeline: where the bulk MoE kernels' time goes at decode sizes, block by block.
// Why: at one token the up and down kernels stream 50 + 25 MB at 56% / 42% of DRAM (ncu, session 27) where the
// same kernels reach 94% of copy at 16 tokens; ncu says the consumers wait for bytes but not when. Here each
// block writes its timeline (set_moe_bulk_stamps: entry, barriers ready, first and last copies issued, first
// bytes landed, each consumer group's exit), read back after one cold call (L2 flushed first), and the same
// bytes are read by the plain read probes in one cold launch each: the ceiling of one kernel of that size,
// ramp and tail included, measured in the same run.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/moe.cuh"
#include "backends/cuda/kernels/read_probe.cuh"
#include "backends/cuda/timing.h"
#include "bench_sections.h"
#include "gpu_test_util.h"
#include "ops/moe.h"

namespace tern::gputest {
namespace {

using W = cuda::MoeBulkStamp;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One kernel's stamps over the runs: each figure's median over blocks (and its max), averaged over runs.
struct KernelTimeline {
  std::vector<double> span_us, skew_us, ready_us, staged_us, first_issue_us, first_data_us, last_issue_us, exit_us,
      exit_max_us, idle_tail_us, items, jobs;
};

// words: grid x kMoeBulkStampWords of one launch. Cycle counts to us by the clock rate that the block's own global
// timer stamps give over its lifetime (median over blocks).
void add_run(KernelTimeline& k, const std::vector<unsigned long long>& words, int grid) {
  auto at = [&](int b, int w) { return static_cast<double>(words[static_cast<size_t>(b) * cuda::kMoeBulkStampWords + w]); };
  std::vector<int> live;
  for (int b = 0; b < grid; ++b)
    if (at(b, W::items) > 0 && at(b, W::exit_ns) > 0) live.push_back(b);
  if (live.empty()) return;
  std::vector<double> ghz;
  for (int b : live) {
    const double ns = at(b, W::exit_ns) - at(b, W::entry_ns);
    if (ns > 2000) ghz.push_back((at(b, W::exit0) - at(b, W::entry)) / ns);
  }
  const double cyc_per_us = 1e3 * (ghz.empty() ? 1.75 : median(ghz));
  double t0 = 1e300, t1 = 0, last_entry = 0;
  for (int b : live) {
    t0 = std::min(t0, at(b, W::entry_ns));
    last_entry = std::max(last_entry, at(b, W::entry_ns));
  }
  std::vector<double> ready, staged, fi, fd, li, ex, ends;
  for (int b : live) {
    const double e = at(b, W::entry);
    double last_exit = 0;
    for (int g = 0; g < W::kExitGroups; ++g) last_exit = std::max(last_exit, at(b, W::exit0 + g));
    ready.push_back((at(b, W::ready) - e) / cyc_per_us);
    staged.push_back((at(b, W::staged) - e) / cyc_per_us);
    fi.push_back((at(b, W::first_issue) - e) / cyc_per_us);
    fd.push_back((at(b, W::first_full) - at(b, W::first_issue)) / cyc_per_us);
    li.push_back((at(b, W::last_issue) - e) / cyc_per_us);
    const double exit = (last_exit - e) / cyc_per_us;
    ex.push_back(exit);
    const double end_ns = at(b, W::entry_ns) + exit * 1e3;
    ends.push_back(end_ns);
    t1 = std::max(t1, end_ns);
    k.items.push_back(at(b, W::items));
    k.jobs.push_back(at(b, W::jobs));
  }
  std::vector<double> tail;
  for (double e : ends) tail.push_back((t1 - e) / 1e3);
  k.span_us.push_back((t1 - t0) / 1e3);
  k.skew_us.push_back((last_entry - t0) / 1e3);
  k.ready_us.push_back(median(ready));
  k.staged_us.push_back(median(staged));
  k.first_issue_us.push_back(median(fi));
  k.first_data_us.push_back(median(fd));
  k.last_issue_us.push_back(median(li));
  k.exit_us.push_back(median(ex));
  k.exit_max_us.push_back(*std::max_element(ex.begin(), ex.end()));
  k.idle_tail_us.push_back(median(tail));
}

double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

void print_timeline(const char* name, int64_t T, const KernelTimeline& k, double bytes, double copy_gbs) {
  const double span = mean(k.span_us);
  std::printf("| %s | %lld | %.1f | %.0f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f / %.2f | %.2f | %.1f / %.1f |\n", name,
              static_cast<long long>(T), span, copy_gbs > 0 ? 100.0 * bytes / (span * 1e3) / copy_gbs : 0.0,
              mean(k.skew_us), mean(k.ready_us), mean(k.staged_us), mean(k.first_issue_us), mean(k.first_data_us), mean(k.last_issue_us),
              mean(k.exit_us), mean(k.exit_max_us), mean(k.idle_tail_us), mean(k.items), mean(k.jobs));
}

}  // namespace

void bench_moe_timeline(Rand& r, double copy_gbs) {
  const int64_t E = 256, D = 4096, inter = 2048, k = 6;
  const ops::WeightFormat f = ops::WeightFormat::mxfp4;
  const HostWeight w1 = random_weight(f, inter, D, r, 0.03f, "w1"), w2 = random_weight(f, D, inter, r, 0.02f, "w2");
  cuda::WeightStore store;
  std::vector<ops::Expert> experts(E);
  for (int64_t e = 0; e < E; ++e) experts[e] = ops::Expert{store.upload(w1.w), store.upload(w2.w), store.upload(w1.w)};
  const double up_bytes = 2.0 * static_cast<double>(w1.w.weight.nbytes() + w1.w.scale.nbytes());
  const double down_bytes = static_cast<double>(w2.w.weight.nbytes() + w2.w.scale.nbytes());
  cuda::CudaBackend& be = cuda::register_backend();
  const int grid = be.num_sms();
  const size_t words = static_cast<size_t>(grid) * cuda::kMoeBulkStampWords;
  cuda::DeviceBuffer stamps(2 * words * sizeof(unsigned long long));
  cuda::DeviceBuffer flush(size_t{256} << 20);
  auto* up_words = static_cast<unsigned long long*>(stamps.data());
  std::printf("\nbulk MoE kernels, block timelines (one cold call a run, L2 flushed, 8 runs; us; span: first entry to "
              "last exit; skew: last block's entry after the first's; then medians over blocks, from the block's "
              "entry: barriers ready, first window staged, first copies issued, first bytes landed after them, last copies issued, last "
              "group's exit (median / max); tail: the median block's idle time before the kernel's end; items a "
              "block):\n| kernel | T | span | %% of copy | skew | ready | x staged | 1st issue | 1st data | last issue | exit | "
              "tail | items / jobs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const int64_t T : {int64_t{1}, int64_t{4}, int64_t{16}})
  for (const int resident : {1, 0}) {
    if (T > cuda::kMoeResidentMaxTokens && resident == 0) continue;
    be.set_knob("TERN_MOE_RESIDENT", resident);
    KernelTimeline up, down;
    double distinct_sum = 0;
    const int runs = 8;
    for (int run = 0; run < runs; ++run) {
      const Tensor idx = random_picks(T, E, k, r);
      std::vector<char> used(E, 0);
      for (int64_t i = 0; i < T * k; ++i) used[idx.data<int32_t>()[i]] = 1;
      distinct_sum += static_cast<double>(std::count(used.begin(), used.end(), 1));
      auto dx = upload(random_f32({T, D}, r)), dw = upload(random_f32({T, k}, r)), didx = upload(idx);
      cuda::DeviceTensor out(DType::f32, {T, D});
      be.synchronize();
      TERN_CUDA(cudaMemset(flush.data(), run, flush.size()));  // evicts the experts' bytes from L2
      TERN_CUDA(cudaMemset(stamps.data(), 0, stamps.size()));
      TERN_CUDA(cudaDeviceSynchronize());
      cuda::set_moe_bulk_stamps({up_words, up_words + words});
      ops::moe_experts(cuda::context(), ops::MoeExpertsArgs{dx, didx, dw, experts, 10.0f, out});
      be.synchronize();
      cuda::set_moe_bulk_stamps({});
      std::vector<unsigned long long> host(2 * words);
      TERN_CUDA(cudaMemcpy(host.data(), stamps.data(), stamps.size(), cudaMemcpyDeviceToHost));
      add_run(up, std::vector<unsigned long long>(host.begin(), host.begin() + static_cast<long>(words)), grid);
      add_run(down, std::vector<unsigned long long>(host.begin() + static_cast<long>(words), host.end()), grid);
    }
    const double distinct = distinct_sum / runs;
    const bool shown = T <= cuda::kMoeResidentMaxTokens;  // (a resident row only where the layout exists)
    print_timeline(shown ? (resident ? "up, resident" : "up, fixed ranges") : "up", T, up, up_bytes * distinct, copy_gbs);
    print_timeline(shown ? (resident ? "down, resident" : "down, fixed ranges") : "down", T, down,
                   down_bytes * distinct, copy_gbs);
  }
  be.set_knob("TERN_MOE_RESIDENT", 1);
  std::printf("(path at T=1: %s)\n", be.moe_path(experts[0].w1, 1, k).c_str());

  // The ceiling: the same bytes in one cold launch of the read probes (buffers rotated past L2, in a graph),
  // the bulk ring as the MoE kernels' (32 KB stages, 5 deep, each block its own range) and plain loads.
  std::printf("\none cold read of a MoE kernel's bytes (us; %% of copy %.0f GB/s):\n| MB | bulk ring 5 x 32 KB | %% | "
              "ldg 8 x 16 B, 4 blocks/SM | %% |\n|---:|---:|---:|---:|---:|\n", copy_gbs);
  constexpr size_t kPool = size_t{768} << 20;
  cuda::DeviceBuffer pool(kPool), sink(64);
  TERN_CUDA(cudaMemset(pool.data(), 1, kPool));
  cuda::prepare_read_probes();
  const auto* data = static_cast<const uint8_t*>(pool.data());
  auto* out = static_cast<uint32_t*>(sink.data());
  for (const double mb : {12.6, 25.2, 50.3, 75.5}) {
    const auto bytes = static_cast<size_t>(mb * 1048576.0) / 32768 * 32768;
    const int count = static_cast<int>(std::min<size_t>(kPool / bytes, 16));
    auto stream = [&] { return static_cast<cudaStream_t>(be.stream()); };
    const cuda::Timing bulk = cuda::time_graph([&](int i) {
      cuda::launch_bulk_read(data + static_cast<size_t>(i) * bytes, static_cast<int64_t>(bytes / 32768), 32768, 5, 4,
                             true, grid, out, stream());
    }, count, 10);
    const cuda::Timing ldg = cuda::time_graph([&](int i) {
      cuda::launch_ldg_read(data + static_cast<size_t>(i) * bytes, static_cast<int64_t>(bytes), 8, 4 * grid, out,
                            stream());
    }, count, 10);
    auto pct = [&](const cuda::Timing& t) { return 100.0 * static_cast<double>(bytes) / (t.median_us * 1e3) / copy_gbs; };
    std::printf("| %.1f | %.1f | %.0f%% | %.1f | %.0f%% |\n", static_cast<double>(bytes) / 1048576.0, bulk.median_us,
                pct(bulk), ldg.median_us, pct(ldg));
  }
  std::fflush(stdout);
}

}  // namespace tern::gputest
