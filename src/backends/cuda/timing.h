// Device timing for benchmarks and the profiler, with no CUDA header: CUDA events around each run on the
// backend's stream, after a warm-up; the median of the runs is the figure to report (METHOD.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace tern::cuda {

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int runs = 0;
};

// Times fn() (which issues work on the registered CUDA backend's stream) `runs` times after `warmup` calls.
Timing time_device(const std::function<void()>& fn, int warmup, int runs);

// Captures fn(0), fn(1), ..., fn(count - 1) into one CUDA graph on a private stream (after one eager run
// of the same calls, which sizes the workspace and builds per-weight tables) and times the graph's
// replays; the figures are per call (replay / count). No host work sits between the kernels, as in a
// captured decode step.
Timing time_graph(const std::function<void(int)>& fn, int count, int runs);

// Device-to-device copy of `bytes` (cudaMemcpyAsync), in GB/s counting bytes read plus bytes written.
double copy_bandwidth_gbs(size_t bytes, int runs = 10);

// One configuration of the read-bandwidth probes (kernels/read_probe.cu): how ("bulk": cp.async.bulk rings of
// `stages` slots of stage_kb KB, `copies` copies a stage, the blocks side by side or each in its own contiguous
// range; "ldg": `stages` 16-byte loads in flight a thread),
// blocks per multiprocessor, KB in flight per multiprocessor at most, and the GB/s read.
struct ReadProbe {
  const char* how;
  int stage_kb, stages, copies, blocks_per_sm;
  int64_t kb_in_flight;
  double gbs;
};
// The sweep over a buffer of `bytes` read once per run (GB/s count bytes read only).
std::vector<ReadProbe> read_bandwidth_probes(size_t bytes, int num_sms);

// The tile probe (read_probe.cu): tiles of `rows` rows of 2 KB (an up matrix's FP4 rows at V4-Flash) read in stages
// of `chunk` bytes a row, 16 KB a stage, `stages` deep, `blocks_per_sm` blocks a multiprocessor; GB/s read.
struct TileProbe {
  int rows, chunk, stages, blocks_per_sm, l2_prefetch;
  double gbs;
};
std::vector<TileProbe> tile_read_probes(size_t bytes, int num_sms);

// Reads of one decode product's size, back to back in a CUDA graph as a decode step issues them (each kernel
// waits for the previous one, PDL as everywhere): the ldg probe with `unroll` loads in flight a thread, over
// buffers rotated so that no read hits L2 (hot: the same buffer every time, so reads of up to ~40 MB find
// their bytes in L2). us a read (graph median / reads) and GB/s: the ceiling a single kernel of that size
// reaches, ramp and tail included.
struct SmallReadProbe {
  size_t bytes;
  int unroll, blocks_per_sm;
  bool hot;
  double us, gbs;
};
std::vector<SmallReadProbe> small_read_probes(const std::vector<size_t>& sizes, int num_sms);

// The FP4 decode probe (kernels/fp4_decode_probe.cu): a buffer of about `bytes` of FP4 items streamed once per
// run through each variant's decode (`name`), with `consumers` warpgroups and `stages` ring slots a block; GB/s
// count the bytes read (weights and scales). A rate probe: the products are not checked.
struct DecodeProbe {
  const char* name;
  int consumers, stages;
  double gbs;
};
std::vector<DecodeProbe> fp4_decode_probes(size_t bytes, int num_sms);

// Copies `bytes` from one device address to another (benchmarks replicate weights on the device).
void device_copy(void* dst, const void* src, size_t bytes);

}  // namespace tern::cuda
