// CudaBackend::sample_rows: packs the rows' parameters and histories on the host (one buffer), uploads
// them, samples every row in one launch (kernels/sampling.cu) and brings back only the results.
#include <vector>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/sampling.cuh"
#include "core/error.h"

namespace tern::cuda {

void CudaBackend::sample_rows(const TensorView& logits, std::span<const ops::SampleRowSpec> specs,
                              std::span<ops::SampledRow> out) {
  require_cuda_f32("sample_rows", {&logits});
  TERN_CHECK(logits.is_contiguous(), "cuda sample_rows: the logits must be contiguous");
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  TERN_CHECK(rows < (int64_t{1} << 31) && vocab < (int64_t{1} << 31), "cuda sample_rows: ", rows, " x ", vocab,
             " logits are too many");
  thread_local std::vector<uint8_t> packed;
  ops::pack_sample_rows(specs, vocab, packed);
  // One buffer of its own (not the shared workspace, whose moves make the decode graphs record again):
  // [packed | results | work rows * vocab floats].
  const size_t packed_bytes = static_cast<size_t>(align_up(static_cast<int64_t>(packed.size()), 256));
  const size_t out_bytes = static_cast<size_t>(align_up(rows * static_cast<int64_t>(sizeof(ops::SampledRow)), 256));
  const size_t need = packed_bytes + out_bytes + static_cast<size_t>(rows * vocab) * sizeof(float);
  if (impl_->sample_buffer.size() < need)
    impl_->sample_buffer = DeviceBuffer(static_cast<size_t>(align_up(static_cast<int64_t>(need), 1 << 20)));
  auto* base = static_cast<uint8_t*>(impl_->sample_buffer.data());
  auto* dev_out = reinterpret_cast<ops::SampledRow*>(base + packed_bytes);
  auto* work = reinterpret_cast<float*>(base + packed_bytes + out_bytes);
  TERN_CUDA(cudaMemcpyAsync(base, packed.data(), packed.size(), cudaMemcpyHostToDevice, impl_->stream));
  launch_sample_rows(logits.data_as<float>(), rows, vocab, base, work, dev_out, impl_->stream);
  check_launch("sample_rows");
  TERN_CUDA(cudaMemcpyAsync(out.data(), dev_out, static_cast<size_t>(rows) * sizeof(ops::SampledRow),
                            cudaMemcpyDeviceToHost, impl_->stream));
  TERN_CUDA(cudaStreamSynchronize(impl_->stream));
}

}  // namespace tern::cuda
