#include "backends/cuda/cuda_graph_arena.h"

#include "backends/cuda/cuda_check.h"
#include "core/error.h"

namespace tern::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
}  // namespace

CudaStepGraphs::CudaStepGraphs(CudaBackend& backend) : backend_(backend) {
  TERN_CUDA(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
}

CudaStepGraphs::~CudaStepGraphs() {
  for (cudaGraphExec_t e : execs_) cudaGraphExecDestroy(e);
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

void* CudaStepGraphs::pinned_host(size_t bytes) {
  if (bytes <= pinned_bytes_) return pinned_;
  backend_.synchronize();  // no copy may still read the old staging
  if (pinned_ != nullptr) TERN_CUDA(cudaFreeHost(pinned_));
  pinned_ = nullptr;
  pinned_bytes_ = 0;
  TERN_CUDA(cudaMallocHost(&pinned_, bytes));
  pinned_bytes_ = bytes;
  return pinned_;
}

void CudaStepGraphs::arena_begin(bool measure) {
  TERN_CHECK(!open_, "step graphs: an arena scope is already open");
  open_ = true, measure_ = measure, used_ = 0;
}

size_t CudaStepGraphs::arena_end() {
  TERN_CHECK(open_, "step graphs: no arena scope is open");
  open_ = false;
  return used_;
}

void CudaStepGraphs::arena_reserve(size_t bytes) {
  TERN_CHECK(!open_, "step graphs: the arena cannot move while a scope is open");
  drop_all();
  arena_ = DeviceBuffer();  // frees after a device synchronisation
  arena_ = DeviceBuffer(aligned(bytes));
  ++arena_generation_;
}

void* CudaStepGraphs::allocate(size_t bytes) {
  if (!open_) return nullptr;
  const size_t b = aligned(bytes == 0 ? 1 : bytes);
  if (measure_) {
    used_ += b;
    return nullptr;
  }
  TERN_CHECK(capturing_, "step graphs: an arena block outside a capture (the graph's first node zeroes the arena)");
  TERN_CHECK(used_ + b <= arena_.size(), "step graphs: the activation arena (", arena_.size(),
             " bytes) is too small for this step (", used_ + b, " bytes so far): size it with a measuring run");
  void* p = static_cast<char*>(arena_.data()) + used_;
  used_ += b;
  return p;
}

bool CudaStepGraphs::owns(const void* p) const {
  const char* base = static_cast<const char*>(arena_.data());
  return base != nullptr && p >= base && p < base + arena_.size();
}

int CudaStepGraphs::capture(const std::function<void()>& body) {
  backend_.synchronize();
  size_t free_before = 0, total = 0;
  TERN_CUDA(cudaMemGetInfo(&free_before, &total));
  void* const old_stream = backend_.stream();
  backend_.set_stream(capture_stream_);
  TERN_CUDA(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  capturing_ = true;
  try {
    body();
  } catch (...) {
    capturing_ = false;
    cudaStreamEndCapture(capture_stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    backend_.set_stream(old_stream);
    throw;
  }
  capturing_ = false;
  const cudaError_t end = cudaStreamEndCapture(capture_stream_, &graph);
  backend_.set_stream(old_stream);
  if (end != cudaSuccess) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    fail("CUDA graph capture failed: ", cudaGetErrorString(end));
  }
  try {
    zero_arena_first(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA graph instantiation failed: ", cudaGetErrorString(inst));
  }
  TERN_CUDA(cudaGraphUpload(exec, static_cast<cudaStream_t>(old_stream)));
  backend_.synchronize();
  size_t free_after = 0;
  TERN_CUDA(cudaMemGetInfo(&free_after, &total));
  if (free_after < free_before) graph_bytes_ += free_before - free_after;
  execs_.push_back(exec);
  return static_cast<int>(execs_.size()) - 1;
}

// Core's device tensors are zero-filled. Arena blocks are never reused within a step, so one memset of the
// bytes this step's tensors took, ahead of every other node, gives each of them zeros at every replay (one
// node instead of one memset per tensor: the tiny model's decode step had 118 of them, 19% of its GPU time).
void CudaStepGraphs::zero_arena_first(cudaGraph_t graph) {
  if (used_ == 0) return;
  size_t num_roots = 0;
  TERN_CUDA(cudaGraphGetRootNodes(graph, nullptr, &num_roots));
  std::vector<cudaGraphNode_t> roots(num_roots);
  TERN_CUDA(cudaGraphGetRootNodes(graph, roots.data(), &num_roots));
  cudaMemsetParams zero{};
  zero.dst = arena_.data();
  zero.value = 0;
  zero.elementSize = 4;  // used_ is a multiple of kAlign
  zero.width = used_ / 4;
  zero.height = 1;
  cudaGraphNode_t memset = nullptr;
  TERN_CUDA(cudaGraphAddMemsetNode(&memset, graph, nullptr, 0, &zero));
  for (cudaGraphNode_t root : roots) TERN_CUDA(cudaGraphAddDependencies(graph, &memset, &root, nullptr, 1));
}

void CudaStepGraphs::replay(int handle) {
  TERN_CHECK(handle >= 0 && handle < static_cast<int>(execs_.size()) && execs_[handle] != nullptr,
             "step graphs: no recorded step ", handle);
  TERN_CUDA(cudaGraphLaunch(execs_[handle], static_cast<cudaStream_t>(backend_.stream())));
}

void CudaStepGraphs::drop_all() {
  if (!execs_.empty()) backend_.synchronize();
  for (cudaGraphExec_t e : execs_) cudaGraphExecDestroy(e);
  execs_.clear();
  graph_bytes_ = 0;
}

uint64_t CudaStepGraphs::generation() const {
  return (arena_generation_ << 48) ^ static_cast<uint64_t>(backend_.workspace_bytes());
}

}  // namespace tern::cuda
