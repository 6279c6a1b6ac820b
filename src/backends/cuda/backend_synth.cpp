// CudaBackend::synth_fill: synthetic weights written on the device (kernels/synth.cu).
#include <cstdint>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/kernels/pdl.cuh"
#include "backends/cuda/kernels/synth.cuh"

namespace tern::cuda {

void CudaBackend::synth_fill(const ops::SynthFillArgs& a) {
  TERN_CHECK(a.out.device() == Device::cuda, "cuda synth_fill: host tensors");
  auto* q = a.out.data_as<uint8_t>();
  auto* s = a.scale.data_as<uint8_t>();
  switch (a.kind) {
    case ops::SynthKind::normal:
    case ops::SynthKind::uniform:
      launch_synth_values(a.kind == ops::SynthKind::normal, a.seed, a.a, a.b, a.out.data(),
                          a.out.dtype() == DType::bf16, a.out.numel(), impl_->stream);
      break;
    case ops::SynthKind::fp8_block:
      launch_synth_fp8(a.seed, a.b, a.rows, a.cols, q, s, impl_->stream);
      break;
    case ops::SynthKind::mxfp4:
    case ops::SynthKind::nvfp4:
      TERN_CHECK(reinterpret_cast<uintptr_t>(q) % 4 == 0, "cuda synth_fill: the packed FP4 output must be 4-byte aligned");
      launch_synth_fp4(a.kind == ops::SynthKind::nvfp4, a.seed, a.b, a.global_scale, a.rows, a.cols, q, s,
                       impl_->stream);
      break;
    case ops::SynthKind::distinct_rows:
      launch_synth_distinct_rows(a.seed, a.out.dim(0), static_cast<int>(a.out.dim(1)), a.choices,
                                 a.out.data_as<int64_t>(), impl_->stream);
      break;
  }
  // These are weights: a kernel launched next may copy them before its grid_dependency_wait (launch.cuh).
  launch_pdl_fence(impl_->stream);
  check_launch("synth_fill");
}

}  // namespace tern::cuda
