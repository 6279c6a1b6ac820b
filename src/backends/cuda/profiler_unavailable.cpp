// cuda::Profiler in a build whose CUDA toolkit has no CUPTI (src/backends/cuda/CMakeLists.txt picks this
// file then): constructing one throws, saying what is missing, so `--profile` fails clearly instead of
// printing an empty profile.
#include "backends/cuda/profiler.h"

#include "core/error.h"

namespace tern::cuda {

void trace_graph_edges(CUgraph_st*) {}

Profiler::Profiler() {
  fail("cuda::Profiler: this tern was built without CUPTI (the CUDA toolkit's libcupti and cupti.h were not ",
       "found at configure time); install the toolkit's CUPTI and reconfigure with -DTERN_CUDA=ON");
}

Profiler::~Profiler() = default;

void Profiler::start() { fail("cuda::Profiler: built without CUPTI"); }

void Profiler::stop() { fail("cuda::Profiler: built without CUPTI"); }

}  // namespace tern::cuda
