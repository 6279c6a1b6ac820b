// Sections of tern_gpu_bench that live in files of their own (bench_gpu_kernels.cpp runs them).
#pragma once

#include "gpu_test_util.h"

namespace tern::gputest {

// --only moe_timeline (bench_moe_timeline.cpp): the bulk MoE kernels' block timelines at 1, 4 and 16 tokens, and
// one cold read of the same bytes by the read probes. copy_gbs: the run's copy bandwidth.
void bench_moe_timeline(Rand& r, double copy_gbs);

}  // namespace tern::gputest
