#include "backends/cuda/timing.h"

#include <algorithm>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"

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

void device_copy(void* dst, const void* src, size_t bytes) {
  TERN_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

}  // namespace tern::cuda
