// CudaBackend: device checks at startup, the stream, the workspace and the device error word.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/cuda_graph_arena.h"
#include "backends/cuda/kernels/errors.h"
#include "backends/cuda/kernels/linear_x8.cuh"
#include "backends/cuda/kernels/pdl.cuh"
#include "core/env.h"

namespace tern::cuda {

namespace {
// The backend's on/off switches that live in Impl (backend_impl.h says what each selects; all for A/B, each
// keeping the bits): read from the environment at construction, then `knob` / `set_knob` by name (bench-step
// --ab). TERN_PDL, process-wide, and the integer knobs are handled apart.
struct ImplSwitch {
  const char* name;
  bool CudaBackend::Impl::*member;
};
constexpr ImplSwitch kImplSwitches[] = {
    {"TERN_MOE_STAGE_QUANT", &CudaBackend::Impl::moe_stage_quant},
    {"TERN_MOE_STAGE_QUANT_H", &CudaBackend::Impl::moe_stage_quant_h},
    {"TERN_MOE_EARLY_DOWN", &CudaBackend::Impl::moe_early_down},
    {"TERN_MOE_RESIDENT", &CudaBackend::Impl::moe_resident},
    {"TERN_MOE_CLAIMS", &CudaBackend::Impl::moe_claims},
    {"TERN_X8_QUANT", &CudaBackend::Impl::x8_quantises_x},
    {"TERN_HC_POST_SQUARES", &CudaBackend::Impl::hc_post_squares},
    {"TERN_ROUTE_REGS", &CudaBackend::Impl::route_regs},
    {"TERN_MOE_FUSED_PLAN", &CudaBackend::Impl::moe_fused_plan},
    {"TERN_HC_EARLY_FN", &CudaBackend::Impl::hc_early_fn},
    {"TERN_TOPK_FAST", &CudaBackend::Impl::topk_fast},
    {"TERN_X8_CLUSTER", &CudaBackend::Impl::x8_cluster},
    {"TERN_BRANCH_PRIORITY", &CudaBackend::Impl::branch_priority},
};

const ImplSwitch* impl_switch(std::string_view name) {
  for (const ImplSwitch& sw : kImplSwitches)
    if (name == sw.name) return &sw;
  return nullptr;
}

// The step graphs and the two device memories of a new backend (below, with the memories).
void make_memories(CudaBackend& backend, CudaBackend::Impl& m);
}  // namespace

CudaBackend::CudaBackend() : impl_(std::make_unique<Impl>()) {
  TERN_CHECK(device_available(), "the CUDA backend needs a CUDA device, and none was found");
  int dev = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  TERN_CUDA(cudaGetDeviceProperties(&prop, dev));
  TERN_CHECK(prop.major == 9 && prop.minor == 0, "the CUDA backend is built for Hopper (sm_90a: H100, H200); this ",
             prop.name, " is sm_", prop.major, prop.minor, ", which its kernels cannot run on");
  impl_->num_sms = prop.multiProcessorCount;
  impl_->error_word = DeviceBuffer(sizeof(int));
  TERN_CUDA(cudaMemset(impl_->error_word.data(), 0, sizeof(int)));
  // TERN_MOE_VARIANT: a debugging override of the routed-expert kernel variant (CudaBackend::moe_variant_name;
  // 4 forces the register kernel), e.g. to take a suspect kernel out of a whole-model run. An integer from 0 to
  // moe_variants() - 1; anything else is refused.
  if (env_string("TERN_MOE_VARIANT"))
    set_moe_variant(static_cast<int>(env_int("TERN_MOE_VARIANT", 0, 0, moe_variants() - 1)));
  // TERN_MOE_PREFILL=library: prefill chunks' FP4 experts on the older library path (A/B against the grouped
  // kernels); grouped, or unset, keeps the grouped kernels; anything else is refused.
  if (env_choice("TERN_MOE_PREFILL", {"grouped", "library"}, "grouped") == "library") impl_->moe_prefill_library = true;
  // TERN_MOE_GROUPED_MIN_TOKENS: the token count from which FP4 experts run on the grouped tensor-core kernels
  // (decode and verify steps of more than 64 tokens by default: kMoeGroupedMinTokensDefault, backend_impl.h); for
  // measuring the crossover (bench-step, tern_gpu_bench). At most kLibraryMinTokens: above it the library products
  // take over, and the grouped kernels are its MoE path.
  impl_->moe_grouped_min_tokens =
      env_int("TERN_MOE_GROUPED_MIN_TOKENS", kMoeGroupedMinTokensDefault, 1, kLibraryMinTokens);
  // The on/off switches (kImplSwitches, above): each from its variable, its default the member's initialiser.
  for (const ImplSwitch& sw : kImplSwitches) impl_.get()->*sw.member = env_flag(sw.name, impl_.get()->*sw.member);
  // TERN_DENSE_LIBRARY_MIN_TOKENS: from how many tokens the dense products that are not exact (FP8 block-scaled on
  // cuBLASLt, bf16 on cuBLAS) run on the library (not batch invariant, as every library path); 1 .. kLibraryMinTokens,
  // default kLibraryMinTokens. For the A/B at decode batches of 65-511 tokens.
  impl_->dense_library_min_tokens = env_int("TERN_DENSE_LIBRARY_MIN_TOKENS", kDenseLibraryMinTokensDefault, 1, kLibraryMinTokens);
  // TERN_ATTENTION_SPLIT_KEYS: the tensor-core decode attention's keys a split (AttentionParams::split_keys), 16 ..
  // 1024, default kAttentionSplitKeysDefault (128); for the A/B of more, shorter splits at small batches.
  impl_->attention_split_keys =
      env_int("TERN_ATTENTION_SPLIT_KEYS", kAttentionSplitKeysDefault, 16, 1024);
  impl_->num_counters = 1 << 16;
  impl_->counters = DeviceBuffer(impl_->num_counters * sizeof(int));
  TERN_CUDA(cudaMemset(impl_->counters.data(), 0, impl_->num_counters * sizeof(int)));
  impl_->side.counters = DeviceBuffer(impl_->num_counters * sizeof(int));
  TERN_CUDA(cudaMemset(impl_->side.counters.data(), 0, impl_->num_counters * sizeof(int)));
  // Non-blocking: the side streams must not synchronise with the legacy default stream.
  TERN_CUDA(cudaStreamCreateWithFlags(&impl_->side_low, cudaStreamNonBlocking));
  int least = 0, greatest = 0;
  TERN_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TERN_CUDA(cudaStreamCreateWithPriority(&impl_->side_high, cudaStreamNonBlocking, greatest));
  impl_->side.stream = impl_->side_low;
  TERN_CUDA(cudaEventCreateWithFlags(&impl_->fork_event, cudaEventDisableTiming));
  TERN_CUDA(cudaEventCreateWithFlags(&impl_->join_event, cudaEventDisableTiming));
  make_memories(*this, *impl_);
}

CudaBackend::~CudaBackend() = default;

CudaBackend::Impl::~Impl() {
  if (pinned != nullptr) cudaFreeHost(pinned);
  if (fork_event != nullptr) cudaEventDestroy(fork_event);
  if (join_event != nullptr) cudaEventDestroy(join_event);
  if (side_low != nullptr) cudaStreamDestroy(side_low);  // (side.stream is one of the two)
  if (side_high != nullptr) cudaStreamDestroy(side_high);
}

bool CudaBackend::branch_priority() const { return impl_->branch_priority; }

bool CudaBackend::side_streams_enabled() {
  static const bool on = env_flag("TERN_SIDE_STREAM", true);
  return on;
}

namespace {
// Tells the backend's recorded steps' arena of a side branch.
void arena_branch(CudaBackend::Impl& m, bool begin) {
  if (begin) m.graphs->branch_begin();
  else m.graphs->branch_join();
}
}  // namespace

// Side branches (ops/branch.h). Only a captured step forks: eager steps keep one stream, so the eager
// allocator's stream-ordered reuse stays safe and eager and graph results are the same bits (the same
// kernels on the same inputs; each branch has its own scratch and counters in both modes, so the side
// lane's workspace is sized by the eager runs before any capture).
namespace {
// Moves the backend between its lanes: the workspace and counters always, the stream when the branch runs
// concurrently (side_begin into the side lane; side_end and abandon_branch back to the main one).
void swap_lanes(CudaBackend::Impl& m) {
  std::swap(m.workspace, m.side.workspace);
  std::swap(m.counters, m.side.counters);
  std::swap(m.library, m.side.library);
  if (m.side_concurrent) std::swap(m.stream, m.side.stream);
}
}  // namespace

void CudaBackend::side_begin(bool critical) {
  Impl& m = *impl_;
  TERN_CHECK(!m.in_side, "side_begin: a side branch is already open (side branches do not nest)");
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TERN_CUDA(cudaStreamIsCapturing(m.stream, &capturing));
  m.side_concurrent = side_streams_enabled() && capturing == cudaStreamCaptureStatusActive;
  // The lane's stream by the branch's priority; a branch that follows one not yet joined stays on its stream (it
  // may read what that one wrote: stream order is its only edge).
  if (!m.side_pending)
    m.side.stream = m.branch_priority && critical ? m.side_high : m.side_low;
  if (m.side_concurrent) {
    TERN_CUDA(cudaEventRecord(m.fork_event, m.stream));
    TERN_CUDA(cudaStreamWaitEvent(m.side.stream, m.fork_event, 0));
  }
  swap_lanes(m);
  m.in_side = true;
  arena_branch(m, /*begin=*/true);  // the arena holds blocks freed from now until the join (also when measuring)
}

void CudaBackend::side_end() {
  Impl& m = *impl_;
  TERN_CHECK(m.in_side, "side_end: no side branch is open");
  swap_lanes(m);
  m.in_side = false;  // back on the main lane before anything may throw (abandon_branch must not swap again)
  if (m.side_concurrent) {
    TERN_CUDA(cudaEventRecord(m.join_event, m.side.stream));
    m.side_pending = true;
  }
}

void CudaBackend::abandon_branch() {
  Impl& m = *impl_;
  if (m.in_side) {  // back to the main lane, as side_end would
    swap_lanes(m);
    m.in_side = false;
  }
  m.side_pending = false;  // its join event was recorded in the abandoned capture: never wait on it
  m.side_concurrent = false;
  arena_branch(m, /*begin=*/false);
}

void CudaBackend::side_join() {
  Impl& m = *impl_;
  TERN_CHECK(!m.in_side, "side_join: the side branch is still open (side_end first)");
  arena_branch(m, /*begin=*/false);
  if (!m.side_pending) return;
  TERN_CUDA(cudaStreamWaitEvent(m.stream, m.join_event, 0));
  m.side_pending = false;
}

namespace {

void* grow(DeviceBuffer& buffer, size_t bytes, cudaStream_t stream) {
  if (bytes <= buffer.size()) return buffer.data();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  TERN_CUDA(cudaStreamIsCapturing(stream, &capturing));
  TERN_CHECK(capturing == cudaStreamCaptureStatusNone, "CUDA backend: an op needs ", bytes,
             " bytes of workspace but only ", buffer.size(),
             " are reserved, and it cannot grow during graph capture: call reserve_workspace() before capturing");
  const size_t grown = std::max(bytes, buffer.size() + buffer.size() / 2);
  buffer = DeviceBuffer();  // frees after a device synchronisation
  buffer = DeviceBuffer(align_up(static_cast<int64_t>(grown), 1 << 20));
  return buffer.data();
}

}  // namespace

// TERN_POISON_SCRATCH=1 (a diagnostic): every scratch() call fills the bytes it hands out with 0xff (NaN for
// f32) first, so an op that reads scratch it did not write this call sees NaN at once instead of another op's
// stale values. Recorded graphs get the fill as a node.
static bool poison_scratch() {
  static const bool on = env_flag("TERN_POISON_SCRATCH", false);
  return on;
}

// TERN_ACTIVATION_FILL / set_activation_fill: what uninitialised device tensors (the forward's activations) hold.
// none (the default): whatever the pool gives back; zero: zeros, as before session 10 (the fill cost 45 ms of an
// 8K prefill, 1 674 memsets); poison: 0xff bytes (NaN for f32), so an op that reads an element nobody wrote shows
// NaN (GpuModel_.LongPromptIgnoresActivationFill and bench-step --fill-check compare poison with zero).
namespace {
std::atomic<int> g_activation_fill{-1};  // -1: not read from the environment yet
}  // namespace

CudaBackend::ActivationFill CudaBackend::activation_fill() {
  int v = g_activation_fill.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(parse_activation_fill(env_choice("TERN_ACTIVATION_FILL", {"none", "zero", "poison"}, "none"),
                                               "TERN_ACTIVATION_FILL"));
    g_activation_fill.store(v, std::memory_order_relaxed);
  }
  return static_cast<ActivationFill>(v);
}

CudaBackend::ActivationFill CudaBackend::parse_activation_fill(std::string_view name, std::string_view where) {
  if (name == "none") return ActivationFill::none;
  if (name == "zero") return ActivationFill::zero;
  if (name == "poison") return ActivationFill::poison;
  fail(where, ": expected none, zero or poison, found \"", name, "\"");
}

void CudaBackend::set_activation_fill(ActivationFill fill) {
  g_activation_fill.store(static_cast<int>(fill), std::memory_order_relaxed);
}

void* CudaBackend::Impl::scratch(size_t bytes) {
  void* p = grow(workspace, bytes, stream);
  if (poison_scratch() && bytes > 0) TERN_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream));
  return p;
}
void* CudaBackend::Impl::library_scratch(size_t bytes) { return grow(library_workspace, bytes, stream); }

void* CudaBackend::Impl::pinned_scratch(size_t bytes) {
  if (bytes <= pinned_bytes) return pinned;
  if (pinned != nullptr) TERN_CUDA(cudaFreeHost(pinned));
  pinned = nullptr;
  pinned_bytes = 0;
  TERN_CUDA(cudaMallocHost(&pinned, bytes));
  pinned_bytes = bytes;
  return pinned;
}

LibraryGemm& CudaBackend::Impl::lib() {
  if (!library) library = std::make_unique<LibraryGemm>(in_side ? 0 : 4);
  return *library;
}

void CudaBackend::set_batch_invariant(bool on) { impl_->batch_invariant = on; }
bool CudaBackend::batch_invariant() const { return impl_->batch_invariant; }
void CudaBackend::set_moe_prefill_library(bool on) { impl_->moe_prefill_library = on; }
int64_t CudaBackend::library_min_tokens() { return kLibraryMinTokens; }
void CudaBackend::set_moe_grouped_min_tokens(int64_t tokens) {
  TERN_CHECK(tokens >= 1 && tokens <= kLibraryMinTokens, "cuda: the grouped MoE kernels start at 1 to ",
             kLibraryMinTokens, " tokens, not ", tokens, " (from ", kLibraryMinTokens, " every prefill path is a library "
             "one)");
  impl_->moe_grouped_min_tokens = tokens;
}
int64_t CudaBackend::moe_grouped_min_tokens() const { return impl_->moe_grouped_min_tokens; }
int64_t CudaBackend::moe_e4m3_calls() const { return impl_->moe_e4m3_calls; }
void CudaBackend::set_x8_quantises_x(bool on) { impl_->x8_quantises_x = on; }
void CudaBackend::set_moe_stage_quant(bool on) { impl_->moe_stage_quant = on; }

std::vector<std::string> CudaBackend::knob_names() {
  std::vector<std::string> names;
  for (const ImplSwitch& sw : kImplSwitches) names.emplace_back(sw.name);
  for (const char* n : {"TERN_PDL", "TERN_X8_QUANT_MAX_N", "TERN_MOE_GROUPED_MIN_TOKENS", "TERN_DENSE_LIBRARY_MIN_TOKENS",
                        "TERN_MOE_VARIANT", "TERN_MOE_PREP_MAX_TOKENS"})
    names.emplace_back(n);
  return names;
}

namespace {
[[noreturn]] void unknown_knob(std::string_view name) {
  std::string known;
  for (const std::string& k : CudaBackend::knob_names()) known += (known.empty() ? "" : ", ") + k;
  fail("cuda: no switch named ", name, " (known: ", known, ")");
}
void check_knob_range(std::string_view name, int64_t value, int64_t lo, int64_t hi) {
  TERN_CHECK(lo <= value && value <= hi, "cuda: ", name, " takes ", lo, " .. ", hi, ", not ", value);
}
}  // namespace

int64_t CudaBackend::knob(std::string_view name) const {
  const Impl& m = *impl_;
  if (const ImplSwitch* sw = impl_switch(name)) return m.*sw->member;
  if (name == "TERN_PDL") return pdl_enabled();
  if (name == "TERN_X8_QUANT_MAX_N") return x8_quant_max_n_now();
  if (name == "TERN_MOE_PREP_MAX_TOKENS") return moe_prep_max_tokens();
  if (name == "TERN_MOE_GROUPED_MIN_TOKENS") return m.moe_grouped_min_tokens;
  if (name == "TERN_DENSE_LIBRARY_MIN_TOKENS") return m.dense_library_min_tokens;
  if (name == "TERN_MOE_VARIANT") return m.moe_variant;
  if (name == "TERN_ATTENTION_SPLIT_KEYS") return m.attention_split_keys;
  unknown_knob(name);
}

void CudaBackend::set_knob(std::string_view name, int64_t value) {
  Impl& m = *impl_;
  if (const ImplSwitch* sw = impl_switch(name)) {
    check_knob_range(name, value, 0, 1);
    m.*sw->member = value != 0;
  } else if (name == "TERN_PDL") {
    check_knob_range(name, value, 0, 1);
    set_pdl_enabled(value != 0);
  } else if (name == "TERN_X8_QUANT_MAX_N") {
    set_x8_quant_max_n(static_cast<int>(value));
  } else if (name == "TERN_MOE_GROUPED_MIN_TOKENS") {
    set_moe_grouped_min_tokens(value);
  } else if (name == "TERN_MOE_PREP_MAX_TOKENS") {
    check_knob_range(name, value, 1, kMoeSmallPlanMaxTokens);
    set_moe_prep_max_tokens(value);
  } else if (name == "TERN_DENSE_LIBRARY_MIN_TOKENS") {
    check_knob_range(name, value, 1, kLibraryMinTokens);
    m.dense_library_min_tokens = value;
  } else if (name == "TERN_ATTENTION_SPLIT_KEYS") {
    check_knob_range(name, value, 16, 1024);
    m.attention_split_keys = value;
  } else if (name == "TERN_MOE_VARIANT") {
    check_knob_range(name, value, 0, moe_variants() - 1);
    set_moe_variant(static_cast<int>(value));
  } else {
    unknown_knob(name);
  }
}
CudaBackend::FusedQuantCalls CudaBackend::fused_quant_calls() const {
  return {impl_->x8_quantising_calls, impl_->moe_stage_quant_calls};
}
double CudaBackend::library_gemm_us(int64_t T, int64_t out, int64_t in, bool f32, int reps) {
  return impl_->lib().time_us(impl_->stream, T, out, in, f32, reps);
}
double CudaBackend::library_moe_us(int64_t T, int64_t E, int64_t k, int64_t D, int64_t inter, int reps) {
  return impl_->lib().time_moe_us(impl_->stream, T, E, k, D, inter, reps);
}

void CudaBackend::synchronize() { TERN_CUDA(cudaStreamSynchronize(impl_->stream)); }

void CudaBackend::check_device_errors() {
  TERN_CUDA(cudaDeviceSynchronize());
  int word = 0;
  TERN_CUDA(cudaMemcpy(&word, impl_->err(), sizeof(int), cudaMemcpyDeviceToHost));
  if (word == 0) return;
  TERN_CUDA(cudaMemset(impl_->err(), 0, sizeof(int)));
  std::string what;
  auto add = [&](int bit, const char* msg) {
    if (word & bit) what += (what.empty() ? "" : "; ") + std::string(msg);
  };
  add(kErrTokenId, "a token id outside the embedding or tid2eid table");
  add(kErrExpertIndex, "an expert index outside [0, n_routed_experts)");
  add(kErrSelected, "sparse_attention got a selected compressed entry the query cannot see");
  add(kErrGatherRow, "gather_rows got a row index out of range");
  add(kErrRouterScore, "route_scored got a token whose router scores are all NaN");
  fail("CUDA backend: a kernel saw bad input data: ", what);
}

void CudaBackend::set_stream(void* stream) { impl_->stream = static_cast<cudaStream_t>(stream); }
void* CudaBackend::stream() const { return impl_->stream; }
void CudaBackend::reserve_workspace(size_t bytes) {
  impl_->scratch(bytes);
  // The side lane too (a captured step cannot grow either): swapped in, grown, swapped back.
  std::swap(impl_->workspace, impl_->side.workspace);
  impl_->scratch(bytes);
  std::swap(impl_->workspace, impl_->side.workspace);
}
// Both lanes' scratch (the side branch's too: ops/branch.h): the step graphs' generation includes this, so a
// growth of either (a reallocation the recorded graphs would still point into) makes them record again.
size_t CudaBackend::workspace_bytes() const { return impl_->workspace.size() + impl_->side.workspace.size(); }
int CudaBackend::num_sms() const { return impl_->num_sms; }

namespace {

// The pool: device tensors made without a context (core's Tensor(dtype, shape, Device::cuda), installed for
// Device::cuda by register_backend) and copies, stream-ordered on the backend's stream: cudaMallocAsync from the
// device's default pool (kept, not trimmed at each synchronisation), so the model's per-forward intermediates are
// recycled without cudaMalloc / cudaFree round trips. Never an arena block: while a step is being recorded it
// refuses to allocate (the tensor would be a graph allocation outside the arena, its address lost to the replays).
class PoolMemory final : public DeviceMemory {
 public:
  PoolMemory(CudaBackend& backend, const CudaStepGraphs& graphs) : backend_(backend), graphs_(graphs) {
    int dev = 0;
    TERN_CUDA(cudaGetDevice(&dev));
    cudaMemPool_t pool = nullptr;
    TERN_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = UINT64_MAX;
    TERN_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  void* allocate(size_t bytes, bool zero) override {
    TERN_CHECK(!graphs_.capturing(), "CUDA backend: a device tensor of ", bytes,
               " bytes from the device's memory while a step is being recorded (not from the step's arena: make it "
               "through the context, ops::Context::tensor, or in an op through CudaBackend::Impl::tensor)");
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, stream());
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("cudaMallocAsync of ", bytes, " bytes failed (", cudaGetErrorString(e), "); the device has ", free_b,
           " of ", total_b, " bytes free");
    }
    const CudaBackend::ActivationFill fill = CudaBackend::activation_fill();
    if (zero || fill == CudaBackend::ActivationFill::zero) TERN_CUDA(cudaMemsetAsync(p, 0, bytes, stream()));
    else if (fill == CudaBackend::ActivationFill::poison) TERN_CUDA(cudaMemsetAsync(p, 0xff, bytes, stream()));
    return p;
  }
  void release(void* p) override { cudaFreeAsync(p, stream()); }  // no throw from a deleter
  void copy(void* dst, Device dst_device, const void* src, Device, size_t bytes) override {
    TERN_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream()));
    if (dst_device == Device::cpu) TERN_CUDA(cudaStreamSynchronize(stream()));
  }
  void fill(void* p, uint8_t byte, size_t bytes) override {
    TERN_CUDA(cudaMemsetAsync(p, byte, bytes, stream()));
  }
  void synchronize() override { TERN_CUDA(cudaStreamSynchronize(stream())); }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(backend_.stream()); }
  CudaBackend& backend_;
  const CudaStepGraphs& graphs_;
};

// The step memory (CudaBackend::step_memory): what the context's tensors (the forward's intermediates) and the ops'
// transients (Impl::tensor) come from. While the step graphs have an arena scope open: an arena block (recording),
// or a pool block the measuring scope plans (CudaStepGraphs::allocate / measured); otherwise the pool's. The one
// path by which a device tensor becomes an arena block.
class StepMemory final : public DeviceMemory {
 public:
  StepMemory(CudaStepGraphs& graphs, PoolMemory& pool) : graphs_(graphs), pool_(pool) {}
  void* allocate(size_t bytes, bool zero) override {
    // A recording scope's arena block: filled as the pool's would be by the graph's first nodes at each replay.
    if (void* p = graphs_.allocate(bytes, zero)) return p;
    void* p = pool_.allocate(bytes, zero);
    graphs_.measured(p);  // a measuring scope: p stands for the block it planned
    return p;
  }
  void release(void* p) override {  // no throw from a deleter
    if (!graphs_.release(p)) pool_.release(p);
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    pool_.copy(dst, dst_device, src, src_device, bytes);
  }
  void fill(void* p, uint8_t byte, size_t bytes) override { pool_.fill(p, byte, bytes); }
  void synchronize() override { pool_.synchronize(); }

 private:
  CudaStepGraphs& graphs_;
  PoolMemory& pool_;
};

void make_memories(CudaBackend& backend, CudaBackend::Impl& m) {
  m.graphs = std::make_unique<CudaStepGraphs>(backend);
  auto pool = std::make_unique<PoolMemory>(backend, *m.graphs);
  m.step_memory = std::make_unique<StepMemory>(*m.graphs, *pool);
  m.pool = std::move(pool);
}

}  // namespace

std::vector<std::string> CudaBackend::kernel_paths() const {
  // What each op launches (docs/cuda-backend.md, "Kernel paths"); an op outside these throws "no cuda kernel".
  std::vector<std::string> paths = {
      "linear / grouped_linear (fp8 block, mxfp4, nvfp4): linear_stream_kernel, tensor cores (mma.sync bf16, "
      "f32 accumulate), weights through a per-warp cp.async ring, x rounded to bf16 once per block (from 9 "
      "tokens once per product: linear_x_window_kernel, the same bytes); bf16 "
      "weights (compressors, head): round_bf16_kernel then linear_x8_kernel<bf16> (wgmma m64nNk16 bf16, f32 sums; up to 8 "
      "tokens the compressors' products round x in the kernel, no round_bf16 launch; "
      "TERN_X8_BF16=0 or shapes it does not take: linear_bulk_kernel, cp.async.bulk warp rings, same numerics; "
      "TERN_LINEAR_VARIANT picks others); "
      "f32 weights and shapes neither takes (row groups not a multiple of 128, misaligned fp4 scales): "
      "linear_mma_kernel, same numerics; exact weights (router gate, indexer), CUDA cores, f32, 8 tokens per "
      "weight pass: bf16 rows linear_exact_rows_kernel (a warp per row slice), fp8 rows "
      "linear_exact_lanes_kernel (a thread per row, K slices over blocks), odd shapes linear_simple_kernel",
      "--activations fp8 (the default on a GPU; FP8 weights): act_quant_kernel (1x128 e4m3, power-of-two scales, the "
      "reference's rule) then below 65 tokens (TERN_DENSE_LIBRARY_MIN_TOKENS) linear_x8_kernel (wgmma m64nNk32 e4m3 on both operands in "
      "shared memory, f32 sums scaled per 128-column block; up to 8 tokens linear_x8_kernel quantises x itself "
      "with act_quant's rule, no act_quant launch, TERN_X8_QUANT=0 turns that off; K split over 2-8 blocks: their sums "
      "added through a workspace and an arrival counter, or, where the split grid is one block an SM (TERN_X8_CLUSTER, "
      "on), as one thread-block cluster through shared memory, the same bits); from 65 tokens (not batch invariant): "
      "cuBLASLt's block-scaled FP8 product (1x128 x 128x128 scales; TERN_FP8_LIBRARY=0: the dequantised x on "
      "cuBLAS bf16); exact weights (the indexer's wq_b) and shapes neither takes: the dequantised x (exact in "
      "bf16) through the paths above; routed experts: x and the SwiGLU output h dequantised-quantised in place "
      "around the expert kernels (act_quant_kernel, act_fake_quant_bf16_kernel; TERN_MOE_STAGE_QUANT=1: on the bulk "
      "decode kernels quantised as the kernels stage them, no launch); a prefill chunk's wo_a takes its x as FP8 rows "
      "(ops::Fp8Rows) that attention_prefill_wgmma_kernel's epilogue writes (rotated back, quantised 1x128; version 1 "
      "and short chunks: f32, rope_kernel, act_quant_kernel), on cuBLASLt straight from them (below the library's sizes "
      "act_dequant_kernel, then the paths above)",
      "moe_experts: mxfp4 / nvfp4 experts at up to 64 tokens (256 under --batch-invariant or where "
      "TERN_MOE_GROUPED_MIN_TOKENS moves the grouped kernels up): moe_plan (moe_prep_kernel: with the routing and "
      "x's FP8 quantisation in its launch; TERN_MOE_FUSED_PLAN=0 apart) + moe_bulk_kernel up/down (persistent, "
      "whole weight-row tiles through a bulk-copy ring in shared memory, decoded there) + moe_combine; larger "
      "batches, fp8 / bf16 / f32 experts: moe_plan + moe_expert_kernel up/down + moe_combine; tensor cores, the "
      "same K order (so the same bits) in both",
      "library GEMMs, for products of >= 512 tokens (prefill chunks) unless --batch-invariant: linear / "
      "grouped_linear on cuBLAS bf16 (x rounded to bf16, weights expanded exactly to bf16 in scratch, f32 "
      "accumulate); exact weights: bf16 / FP8 (bf16 numbers) as three cuBLAS bf16 products on x split into three "
      "bf16 planes (f32 accuracy), f32 weights on cuBLAS f32 (no TF32); moe_experts with mxfp4 / nvfp4 experts: "
      "multi-block plan (moe_sort) + grouped GEMMs up (w1|w3 tiles, SwiGLU in the epilogue, h bf16) and down (w2) "
      "scheduled from the device job table (no readback), FP4 decoded in registers, f32 accumulate: from 48 mean "
      "pairs an expert moe_grouped_wgmma_kernel (wgmma, 256 weight rows x 64-128 pairs, two groups in flight), "
      "below moe_grouped_kernel (mma.sync, 32- or 64-pair tiles, weights as A; TERN_MOE_GROUPED=wgmma|mma forces "
      "one, TERN_MOE_GROUPED_TILE=old / 128x128 / small-unswapped for A/B), + moe_combine; fp8 / bf16 experts or TERN_MOE_PREFILL=library: the "
      "plan read back, experts expanded to bf16 in chunks of 1.5 GiB, per-expert cuBLAS products (w1|w3, then w2), "
      "SwiGLU, combine",
      "route_scored: up to 256 experts and 32 picks route_scored_regs_kernel (a warp a token, its scores in registers; "
      "TERN_ROUTE_REGS=0 or more experts: route_scored_kernel, the same bits); route_hash: route_hash_kernel; CUDA "
      "cores, f32",
      "sparse_attention / step_attention: FP8 rows (KV mode fp8) with <= 64 heads: attention_mma_kernel, tensor "
      "cores (mma.sync bf16: q and the softmax weights rounded to bf16, rows exact), split-KV merged in a thread-"
      "block cluster; sparse_attention chunks of >= 512 queries (prefill) unless --batch-invariant or "
      "TERN_ATTENTION_PREFILL=0: version 5, attention_kv_bf16_kernel (the launch's key rows decoded once to bf16) then "
      "attention_prefill_ws_kernel (Hopper wgmma, a producer warpgroup copying 32-key tiles into a ring, two consumer "
      "warpgroups; TERN_ATTENTION_PREFILL=1 / 2 / 3 / 4: attention_prefill_kernel (mma.sync) / attention_prefill_wgmma_"
      "kernel without and with the decode overlapped / the warp-specialised kernel decoding its own tiles), bf16 "
      "numerics, one block per query over all its keys (no split, no merge); f32 rows (KV mode exact) and other "
      "shapes: attention_kernel + "
      "attention_combine_kernel, CUDA cores, f32",
      "indexer_scores / indexer_topk: indexer kernels, CUDA cores, f32, radix select; indexer_topk of >= 512 "
      "queries (prefill) unless --batch-invariant: q.k as cuBLAS f32 products (keys gathered out of their pages) "
      "+ indexer_reduce_kernel, then the same top-k (TERN_INDEXER_PREFILL=mma / mma-fp16x3: indexer_mma_kernel, one "
      "fused tensor-core kernel, split bf16x6 / fp16x3 products at f32 accuracy, only the scores written)",
      "compressor_update: compressor_kernel, CUDA cores, f32",
      "hc_pre / hc_post / hc_head / hc_expand: hc_mix + finish kernels, CUDA cores, f32; hc_pre / hc_head of >= 512 "
      "tokens unless --batch-invariant: the mixing logits as a cuBLAS f32 product + hc_squares, same finish kernels",
      "rms_norm, rope, embedding, add, swiglu, gather_rows, kv_pack / kv_unpack: one kernel each, CUDA cores; "
      "norm_rope (the attention's q heads and kv rows): norm_rope_kernel, rms_norm then RoPE in one launch with "
      "the same bits (rows wider than 1024: rms_norm_row / block then rope_kernel); a prefill chunk's q heads on "
      "the prefill attention kernels: normed and rotated in the kernel's q load, the same bits (TERN_Q_NORM_FOLD=0: "
      "norm_rope_kernel first)",
      "decode steps (batched, one launch per op for all slots): attention / compressor / indexer kernels in "
      "decode mode (per-slot positions, state addresses and block tables on the device) + store_rows_kernel; "
      "step_compress_emit: compressor_emit_kernel, a compressor's accumulator update, rms_norm, RoPE, row "
      "packing and paged store in one launch (the five kernels' device code, same bits; TERN_FUSED_COMPRESS=0, "
      "or entries of another width than 128 / 256 / 512, runs them in turn); replayed as "
      "CUDA graphs per batch bucket (docs/cuda-backend.md, \"CUDA graphs\")",
      "sample_rows (device sampling: penalties, temperature, top-k / top-p / min-p, seeded draw, logprobs): "
      "sample_rows_kernel, one block per row, radix select + bitonic sort of candidate tiers, the host "
      "sampler's arithmetic (f64 sums in its order) so tokens equal the host's",
  };
  if (!q_norm_fold_enabled())
    paths.push_back("the prefill chunks' q norm in the attention's q load off (TERN_Q_NORM_FOLD=0): norm_rope_kernel "
                    "first");
  if (!attention_prefill_enabled())
    paths.push_back("sparse_attention prefill kernel off (TERN_ATTENTION_PREFILL=0): every chunk runs "
                    "attention_mma_kernel");
  if (attention_prefill_version() == 4)
    paths.push_back("sparse_attention prefill kernel version 4 (TERN_ATTENTION_PREFILL=4): attention_prefill_ws_kernel "
                    "(a producer warpgroup decodes 32-key tiles into a ring of 4, two consumer warpgroups take one "
                    "tile of a pair each; bf16 numerics, its own summation order)");
  if (attention_prefill_version() == 3)
    paths.push_back("sparse_attention prefill kernel version 3 (TERN_ATTENTION_PREFILL=3): "
                    "attention_prefill_wgmma_kernel (Hopper wgmma, the FP8 row decode overlapping the S MMAs), the "
                    "default before session 34");
  if (attention_prefill_version() == 1 || attention_prefill_version() == 2)
    paths.push_back(attention_prefill_version() == 1
                        ? "sparse_attention prefill kernel version 1 (TERN_ATTENTION_PREFILL=1): "
                          "attention_prefill_kernel (mma.sync), the same numerics"
                        : "sparse_attention prefill kernel version 2 (TERN_ATTENTION_PREFILL=2): "
                          "attention_prefill_wgmma_kernel (Hopper wgmma) without the overlapped decode, the same "
                          "numerics");
  paths.push_back(exact_path() == ExactPath::cuda_cores
                      ? "exact products (TERN_EXACT_PATH=cuda-cores): the CUDA-core kernels only"
                      : std::string("exact products on tensor cores (TERN_EXACT_PATH=") +
                            (exact_path() == ExactPath::tensor_cores ? "tc): every exact weight" : "auto): FP8 weights") +
                            ": linear_exact_tc_kernel, x as three bf16 terms (f32's 24 bits), weights bf16 numbers, "
                            "f32 accumulation, the K slices of a row tile summed through a thread-block cluster; "
                            "f32-scaled weights and shapes it does not take stay on the CUDA-core kernels");
  if (attention_decode() == AttentionDecode::cluster)
    paths.push_back("sparse_attention / step_attention decode kernel (TERN_ATTENTION_DECODE=cluster): "
                    "attention_mma_kernel, all heads a block");
  else
    paths.push_back(cat("sparse_attention / step_attention decode kernel (TERN_ATTENTION_DECODE=",
                        attention_decode_name(attention_decode()), "): attention_heads_kernel, ",
                        attention_decode() == AttentionDecode::heads16   ? "16 heads a block"
                        : attention_decode() == AttentionDecode::heads32 ? "32 heads a block"
                                                                         : "16 heads a block while the launch fits "
                                                                           "the GPU in one round, else 32",
                        " (grid split x head group x query, two blocks an SM, clusters over the splits), "
                        "attention_mma_kernel's arithmetic head for head (the same bits); FP8 rows with 64 rope dims "
                        "only, other rows stay on attention_mma_kernel"));
  paths.push_back(side_streams_enabled()
                      ? "concurrent branches: inside decode graphs the shared expert (beside the router and routed "
                        "experts) and the compressors and indexer (beside the query projections) run on a second "
                        "stream with their own scratch (TERN_SIDE_STREAM=0 keeps them in order); eager steps in order"
                      : "concurrent branches off (TERN_SIDE_STREAM=0): every op in issue order on one stream");
  if (!impl_->batch_invariant)  // (before the PDL line, which stays last)
    paths.push_back(cat("moe_experts (mxfp4 / nvfp4): the grouped kernels (moe_sort + grouped GEMMs + moe_combine) from ",
                        impl_->moe_grouped_min_tokens, " tokens (TERN_MOE_GROUPED_MIN_TOKENS), the decode kernels below"));
  paths.push_back(pdl_enabled()
                      ? "launches: programmatic dependent launch on (TERN_PDL=0 turns it off): each kernel may start "
                        "while the previous one finishes and waits (griddepcontrol.wait) before touching its data; "
                        "linear_stream / linear_bulk copy their first weight stages before the wait"
                      : "launches: programmatic dependent launch off (TERN_PDL=0): each kernel starts once the previous "
                        "one has finished");
  return paths;
}

DeviceMemory& CudaBackend::memory() { return *impl_->pool; }
DeviceMemory& CudaBackend::step_memory() { return *impl_->step_memory; }
CudaStepGraphs& CudaBackend::step_graphs() { return *impl_->graphs; }

Tensor CudaBackend::Impl::tensor(DType dtype, Shape shape, TensorInit init) {
  return Tensor(dtype, shape, Device::cuda, *step_memory, init);
}

CudaBackend& register_backend() {
  static CudaBackend backend;
  set_device_memory(Device::cuda, &backend.memory());
  return backend;
}

const ops::Context& context() {
  static const ops::Context ctx = [] {
    CudaBackend& b = register_backend();
    return ops::Context(b, Device::cuda, &b.step_memory(), &b.step_graphs());
  }();
  return ctx;
}

namespace {

void require_f32_views(std::string_view op, std::initializer_list<const TensorView*> views, bool rows) {
  for (const TensorView* v : views) {
    if (v->empty()) continue;
    TERN_CHECK(v->device() == Device::cuda, "cuda ", op, ": a tensor is on the host");
    TERN_CHECK(v->dtype() == DType::f32, "no cuda kernel for op ", op, " (", dtype_name(v->dtype()), ")");
    if (rows) TERN_CHECK(v->row_stride() >= 0, "cuda ", op, ": tensors must be rows (each contiguous, evenly spaced)");
    else TERN_CHECK(v->is_contiguous(), "cuda ", op, ": tensors must be contiguous");
  }
}

}  // namespace

void require_cuda_f32(std::string_view op, std::initializer_list<const TensorView*> views) {
  require_f32_views(op, views, false);
}

void require_cuda_f32_rows(std::string_view op, std::initializer_list<const TensorView*> views) {
  require_f32_views(op, views, true);
}

DeviceMat device_mat(const ops::Weight& w) {
  DeviceMat m;
  m.kind = w.format;
  TERN_CHECK(w.weight.device() == Device::cuda && (w.scale.empty() || w.scale.device() == Device::cuda),
             "cuda: weight ", w.name, " is not in device memory (upload it with WeightStore)");
  m.w = w.weight.data();
  m.s = w.scale.empty() ? nullptr : w.scale.data();
  m.out = w.out;
  m.in = w.in;
  m.s_cols = w.scale.empty() ? 0 : w.scale.dim(1);
  m.scale_f32 = !w.scale.empty() && w.scale.dtype() == DType::f32;
  m.global_scale = w.global_scale;
  return m;
}

}  // namespace tern::cuda
