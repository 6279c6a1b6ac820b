#include "backends/cuda/cuda_graph_arena.h"

#include <atomic>

#include "backends/cuda/cuda_check.h"
#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t aligned(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
std::atomic<GraphCapturedHook> g_graph_captured{nullptr};
}  // namespace

void set_graph_captured_hook(GraphCapturedHook hook) { g_graph_captured.store(hook); }

// TERN_ARENA_REUSE=0: freed blocks are not reused within a step (the bump allocator of before session 18, for A/B
// and for ruling the reuse out when a recorded step misbehaves).
CudaStepGraphs::CudaStepGraphs(CudaBackend& backend)
    : backend_(backend), reuse_(env_flag("TERN_ARENA_REUSE", true)) {
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
  open_ = true, measure_ = measure;
  plan_.reset();
  blocks_.clear();
  has_planned_ = false;
  release_error_.clear();
  fills_.clear();
}

size_t CudaStepGraphs::arena_end() {
  TERN_CHECK(open_, "step graphs: no arena scope is open");
  open_ = false;
  blocks_.clear();  // (the scope's tensors still alive are kept by the caller: later scopes may reuse their bytes)
  TERN_CHECK(release_error_.empty(), "step graphs: ", release_error_);
  return plan_.peak();
}

void CudaStepGraphs::arena_reserve(size_t bytes) {
  TERN_CHECK(!open_, "step graphs: the arena cannot move while a scope is open");
  drop_all();
  arena_ = DeviceBuffer();  // frees after a device synchronisation
  arena_ = DeviceBuffer(aligned(bytes));
  ++arena_generation_;
}

void* CudaStepGraphs::allocate(size_t bytes, bool zero) {
  if (!open_) return nullptr;
  const size_t at = plan_.allocate(bytes), b = aligned(bytes == 0 ? 1 : bytes);
  if (measure_) {
    planned_ = at, has_planned_ = true;
    return nullptr;
  }
  TERN_CHECK(capturing_, "step graphs: an arena block outside a capture (the graph's first nodes fill the arena)");
  TERN_CHECK(at + b <= arena_.size(), "step graphs: the activation arena (", arena_.size(),
             " bytes) is too small for this step (", at + b, " bytes so far): size it with a measuring run");
  void* p = static_cast<char*>(arena_.data()) + at;
  blocks_[p] = at;
  // As an eager allocation (CudaBackend's device memory): zeros when asked, else the activation fill.
  const CudaBackend::ActivationFill fill = CudaBackend::activation_fill();
  const int value = zero || fill == CudaBackend::ActivationFill::zero ? 0
                    : fill == CudaBackend::ActivationFill::poison     ? 0xff
                                                                      : -1;
  if (value >= 0) {
    if (!plan_.last_fresh()) {  // an earlier block of the step used these bytes: fill them here, in stream order
      TERN_CUDA(cudaMemsetAsync(p, value, b, static_cast<cudaStream_t>(backend_.stream())));
    } else if (!fills_.empty() && fills_.back().value == value && fills_.back().offset + fills_.back().bytes == at) {
      fills_.back().bytes += b;  // adjacent, same value: one node
    } else {
      fills_.push_back({at, b, value});
    }
  }
  return p;
}

void CudaStepGraphs::measured(void* p) {
  if (!has_planned_) return;
  blocks_[p] = planned_;
  has_planned_ = false;
}

bool CudaStepGraphs::release(const void* p) noexcept {
  const bool arena = owns(p);
  if (!open_) return arena;
  // An earlier scope's kept tensor (a recorded step's logits, streams, record) may share its address with a block
  // of the open scope: the address names the open scope's block, since kept tensors are replaced or dropped only
  // between scopes (DecodeGraphs::record / forget_graphs), never inside one. Until session 19 the kept one was
  // taken to die here and the open block stayed live in the plan: a capture recorded after others (a verify graph
  // on first use) then needed more arena than its measuring run and failed ("the activation arena is too small").
  const auto it = blocks_.find(p);
  if (it == blocks_.end()) return arena;  // not this scope's
  if (reuse_) {
    try {
      plan_.release(it->second);
    } catch (const std::exception& e) {
      if (release_error_.empty()) release_error_ = e.what();
    }
  }
  blocks_.erase(it);
  return arena;
}

void CudaStepGraphs::branch_begin() {
  if (open_) plan_.branch_begin();
}

void CudaStepGraphs::branch_join() {
  if (open_) plan_.branch_join();
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
    backend_.abandon_branch();  // a branch the body left open or unjoined was recorded in this capture
    cudaStreamEndCapture(capture_stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    backend_.set_stream(old_stream);
    throw;
  }
  capturing_ = false;
  const cudaError_t end = cudaStreamEndCapture(capture_stream_, &graph);
  if (end != cudaSuccess) backend_.abandon_branch();  // e.g. a branch never joined: its events died with the capture
  backend_.set_stream(old_stream);
  if (end != cudaSuccess) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    fail("CUDA graph capture failed: ", cudaGetErrorString(end));
  }
  try {
    fill_arena_first(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  try {
    if (const GraphCapturedHook hook = g_graph_captured.load(); hook != nullptr) hook(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  // Node priorities (captured from the lanes' streams) only where TERN_BRANCH_PRIORITY asks: otherwise every node
  // runs at the launch stream's, as before.
  const bool by_node = backend_.branch_priority();
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, by_node ? cudaGraphInstantiateFlagUseNodePriority : 0);
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

// Memsets of the ranges this step's tensors asked to be filled, where no earlier block of the step used them
// (allocate() fills the others where they are allocated), ahead of every other node, give each its fill at every replay (adjacent ranges one node: the tiny
// model's decode step had 118 zeroed tensors, 19% of its GPU time as one memset each). Until session 14 the whole
// arena was zeroed, though the model's activations ask for no fill (eager fills none): 404 us a step at batch 64.
void CudaStepGraphs::fill_arena_first(cudaGraph_t graph) {
  if (fills_.empty()) return;
  size_t num_roots = 0;
  TERN_CUDA(cudaGraphGetRootNodes(graph, nullptr, &num_roots));
  std::vector<cudaGraphNode_t> roots(num_roots);
  TERN_CUDA(cudaGraphGetRootNodes(graph, roots.data(), &num_roots));
  for (const Fill& f : fills_) {
    cudaMemsetParams m{};
    m.dst = static_cast<char*>(arena_.data()) + f.offset;
    m.value = static_cast<unsigned>(f.value) * 0x01010101u;
    m.elementSize = 4;  // offsets and sizes are multiples of kAlign
    m.width = f.bytes / 4;
    m.height = 1;
    cudaGraphNode_t memset = nullptr;
    TERN_CUDA(cudaGraphAddMemsetNode(&memset, graph, nullptr, 0, &m));
    for (cudaGraphNode_t root : roots) TERN_CUDA(cudaGraphAddDependencies(graph, &memset, &root, nullptr, 1));
  }
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
