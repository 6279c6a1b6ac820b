#include "backends/cuda/timing.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/kernels/read_probe.cuh"

namespace tern::cuda {

Timing time_device(const std::function<void()>& fn, int warmup, int runs) {
  auto stream = static_cast<cudaStream_t>(register_backend().stream());
  for (int i = 0; i < warmup; ++i) fn();
  TERN_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(runs + 1);
  for (auto& e : ev) TERN_CUDA(cudaEventCreate(&e));
  TERN_CUDA(cudaEventRecord(ev[0], stream));
  for (int i = 0; i < runs; ++i) {
    fn();
    TERN_CUDA(cudaEventRecord(ev[i + 1], stream));
  }
  TERN_CUDA(cudaEventSynchronize(ev[runs]));
  std::vector<double> us(runs);
  for (int i = 0; i < runs; ++i) {
    float ms = 0;
    TERN_CUDA(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
    us[i] = ms * 1000.0;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  return Timing{us[runs / 2], us.front(), us.back(), runs};
}

Timing time_graph(const std::function<void(int)>& fn, int count, int runs) {
  CudaBackend& backend = register_backend();
  void* const previous = backend.stream();
  cudaStream_t stream = nullptr;
  TERN_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  backend.set_stream(stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Timing t;
  try {
    for (int i = 0; i < count; ++i) fn(i);
    TERN_CUDA(cudaStreamSynchronize(stream));
    TERN_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < count; ++i) fn(i);
    TERN_CUDA(cudaStreamEndCapture(stream, &graph));
    TERN_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    t = time_device([&] { TERN_CUDA(cudaGraphLaunch(exec, stream)); }, 2, runs);
  } catch (...) {
    backend.set_stream(previous);
    throw;
  }
  backend.set_stream(previous);
  t.median_us /= count;
  t.min_us /= count;
  t.max_us /= count;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return t;
}

double copy_bandwidth_gbs(size_t bytes, int runs) {
  DeviceBuffer a(bytes), b(bytes);
  TERN_CUDA(cudaMemset(a.data(), 1, bytes));
  const Timing t = time_device([&] { TERN_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice,
                                                               static_cast<cudaStream_t>(register_backend().stream()))); },
                               2, runs);
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e3);
}

namespace {

// A read probe's buffer of `bytes` (set, never written by the probes), its sink word and the backend's stream.
struct ProbeBuffers {
  DeviceBuffer buf, sink;
  const uint8_t* data;
  uint32_t* out;
  cudaStream_t stream;
  explicit ProbeBuffers(size_t bytes)
      : buf(bytes), sink(64), data(static_cast<const uint8_t*>(buf.data())), out(static_cast<uint32_t*>(sink.data())),
        stream(static_cast<cudaStream_t>(register_backend().stream())) {
    TERN_CUDA(cudaMemset(buf.data(), 1, bytes));
    prepare_read_probes();
  }
};

}  // namespace

std::vector<ReadProbe> read_bandwidth_probes(size_t bytes, int num_sms) {
  constexpr size_t kAlign = 64 * 1024;
  bytes = bytes / kAlign * kAlign;
  const ProbeBuffers pb(bytes);
  const uint8_t* data = pb.data;
  uint32_t* out = pb.out;
  cudaStream_t stream = pb.stream;
  std::vector<ReadProbe> rows;
  auto gbs = [&](const Timing& t) { return static_cast<double>(bytes) / (t.median_us * 1e3); };
  for (bool own : {false, true})
    for (int blocks_per_sm : {1, 2})
      for (int stage_kb : {8, 16, 32})
        for (int stages : {2, 3, 4, 6})
          for (int copies : {1, 4}) {
            const int64_t kb = static_cast<int64_t>(stages) * stage_kb * blocks_per_sm;
            if (kb > 220) continue;  // the shared memory of one multiprocessor
            const int stage_bytes = stage_kb * 1024;
            const auto nstages = static_cast<int64_t>(bytes / stage_bytes);
            const Timing t = time_device([&] {
              launch_bulk_read(data, nstages, stage_bytes, stages, copies, own, num_sms * blocks_per_sm, out, stream);
            }, 2, 10);
            TERN_CUDA(cudaGetLastError());
            rows.push_back({own ? "bulk, own range" : "bulk", stage_kb, stages, copies, blocks_per_sm, kb, gbs(t)});
          }
  for (int blocks_per_sm : {2, 4, 8})
    for (int unroll : {2, 4, 8}) {
      const Timing t = time_device([&] {
        launch_ldg_read(data, static_cast<int64_t>(bytes), unroll, num_sms * blocks_per_sm, out, stream);
      }, 2, 10);
      TERN_CUDA(cudaGetLastError());
      rows.push_back({"ldg", 0, unroll, 1, blocks_per_sm, 256 * 16 * unroll * blocks_per_sm / 1024, gbs(t)});
    }
  return rows;
}

std::vector<TileProbe> tile_read_probes(size_t bytes, int num_sms) {
  constexpr int kRowBytes = 2048, kStageBytes = 16 * 1024;
  const ProbeBuffers pb(bytes);
  std::vector<TileProbe> rows;
  for (int blocks_per_sm : {2, 4})
    for (int stages : {3, 4})
      for (const auto [chunk, l2_prefetch] : {std::pair{64, 0}, std::pair{64, 128}, std::pair{64, 256},
                                                std::pair{128, 0}, std::pair{256, 0}, std::pair{512, 0},
                                                std::pair{2048, 0}}) {
        const int r = kStageBytes / chunk;
        const int64_t tiles = static_cast<int64_t>(bytes / (static_cast<size_t>(r) * kRowBytes));
        // A block's shared memory padded so that no more than blocks_per_sm fit (228 KB a multiprocessor).
        const int smem = 220 * 1024 / blocks_per_sm - 1024;
        if (stages * kStageBytes > smem) continue;
        const Timing t = time_device([&] {
          launch_tile_read(pb.data, tiles, r, kRowBytes, chunk, stages, smem, l2_prefetch, num_sms * blocks_per_sm,
                           pb.out, pb.stream);
        }, 2, 10);
        TERN_CUDA(cudaGetLastError());
        rows.push_back({r, chunk, stages, blocks_per_sm, l2_prefetch,
                        static_cast<double>(tiles) * r * kRowBytes / (t.median_us * 1e3)});
      }
  return rows;
}

std::vector<SmallReadProbe> small_read_probes(const std::vector<size_t>& sizes, int num_sms) {
  constexpr size_t kPool = size_t{512} << 20;  // > 10x the L2: a rotation never finds its bytes there
  DeviceBuffer buf(kPool), sink(64);
  TERN_CUDA(cudaMemset(buf.data(), 1, kPool));
  const auto* data = static_cast<const uint8_t*>(buf.data());
  auto* out = static_cast<uint32_t*>(sink.data());
  std::vector<SmallReadProbe> rows;
  for (size_t bytes : sizes) {
    bytes = (bytes + 4095) / 4096 * 4096;
    const int count = static_cast<int>(std::min<size_t>(kPool / bytes, 64));
    for (bool hot : {false, true})
      for (int blocks_per_sm : {2, 4})
        for (int unroll : {4, 8}) {
          const Timing t = time_graph([&](int i) {
            launch_ldg_read(data + (hot ? 0 : static_cast<size_t>(i) * bytes), static_cast<int64_t>(bytes), unroll,
                            num_sms * blocks_per_sm, out, static_cast<cudaStream_t>(register_backend().stream()));
          }, count, 10);
          TERN_CUDA(cudaGetLastError());
          rows.push_back({bytes, unroll, blocks_per_sm, hot, t.median_us,
                          static_cast<double>(bytes) / (t.median_us * 1e3)});
        }
  }
  return rows;
}

std::vector<DecodeProbe> fp4_decode_probes(size_t bytes, int num_sms) {
  const int64_t items = static_cast<int64_t>(bytes) / fp4_decode_probe_item_bytes();
  const size_t used = static_cast<size_t>(items * fp4_decode_probe_item_bytes());
  DeviceBuffer buf(used), sink(64);
  TERN_CUDA(cudaMemset(buf.data(), 0x5a, used));  // codes of both signs, scale bytes 0x5a (2^-37)
  auto* out = static_cast<uint32_t*>(sink.data());
  auto stream = static_cast<cudaStream_t>(register_backend().stream());
  prepare_fp4_decode_probe();
  std::vector<DecodeProbe> rows;
  for (int variant = 0; variant < 4; ++variant)
    for (int consumers : {2, 3}) {
      const int most = fp4_decode_probe_max_stages() / consumers;  // slots a warpgroup's ring: 2, and the most
      std::vector<int> slots{2};
      if (most > 2) slots.push_back(most);
      for (const int per : slots) {
        const int stages = per * consumers;
        const Timing t = time_device([&] {
          launch_fp4_decode_probe(variant, consumers, static_cast<const uint8_t*>(buf.data()), items, stages, num_sms,
                                  out, stream);
        }, 2, 10);
        TERN_CUDA(cudaGetLastError());
        rows.push_back({fp4_decode_probe_name(variant), consumers, stages,
                        static_cast<double>(used) / (t.median_us * 1e3)});
      }
    }
  return rows;
}

void device_copy(void* dst, const void* src, size_t bytes) {
  TERN_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

}  // namespace tern::cuda
