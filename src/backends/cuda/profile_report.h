// The built-in profiler's report, in plain C++ (built with or without CUDA, so CPU-only CI tests it): the
// profiler's per-kernel totals (cuda::Profiler, profiler.h) grouped into the op categories of
// ../shared/design/performance.md, printed as a table per step or as JSON.
//
//   cuda::Profiler p;
//   p.start();
//   ... run `steps` decode steps ...
//   p.stop();
//   std::cout << cuda::format_report(cuda::categorize(p.records()), steps);
//
// A kernel's category comes from its name alone (rules in profile_report.cpp over the kernels of
// src/backends/cuda/kernels): a linear_* kernel is "dense gemm" whichever projection launched it (the
// indexer's and compressor's projections, the router gate and the shared expert included).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tern::cuda {

// What the profiler measured: one entry per distinct kernel (demangled name) or copy kind.
struct KernelTime {
  std::string name;         // demangled kernel name, or "[memcpy HtoD]", "[memset]", ...
  int64_t count = 0;        // executions
  int64_t total_ns = 0;     // summed GPU time of those executions
  int64_t graph_count = 0;  // executions launched from a CUDA graph (counted in `count` too)
  int64_t exposed_ns = 0;   // the part of that time no earlier-ending activity covered (expose(), below)
};

struct ProfileRecords {
  std::vector<KernelTime> kernels;  // by total_ns, largest first
  int64_t busy_ns = 0;      // union of all activity intervals (overlapping kernels counted once)
  int64_t span_ns = 0;      // first activity start to last activity end (the GPU-side wall of the session)
  int64_t dropped = 0;      // records CUPTI dropped (buffers full): the totals are then too low
  int64_t bad_timestamps = 0;  // records with no valid start/end, left out of the times
};

// One activity's interval and the index of the KernelTime it counts for (the profiler's raw records).
struct ActivitySpan {
  uint64_t start = 0, end = 0;
  int32_t owner = 0;
};
// Each owner's exposed time. Why: under PDL a kernel starts before its predecessor ends and waits, so its own
// time (end - start) counts the wait, and own times summed over a step exceed the step. Taken in the order of
// their ends, each span is credited with end - max(start, the latest earlier end): by how much it moved the GPU's
// last end. On one stream (TERN_SIDE_STREAM=0) that is each kernel's cost on the step's path, and the credits add
// up to the busy time; with concurrent branches a span that ends inside a longer one takes part of that one's
// credit, and the part of the longer one before the shorter one's start is credited to nobody. `owners` sizes
// the result; an owner out of range throws.
std::vector<int64_t> expose(std::vector<ActivitySpan> spans, size_t owners);

enum class OpCategory : int {
  attention,
  indexer,
  compressor,
  moe,
  dense_gemm,
  mhc_norm_rope,
  sampling,
  memcpy,
  other,
};
constexpr int kNumOpCategories = 9;
std::string_view category_name(OpCategory c);  // "attention", ..., "moe experts", "memcpy/memset", "other"

// The base name of a demangled kernel name: no return type, namespaces, template arguments or parameters
// ("void tern::cuda::dev::(anonymous namespace)::attention_kernel<4>(tern::cuda::AttentionParams, int, long)"
// -> "attention_kernel"). Copy records ("[memcpy HtoD]") are returned unchanged.
std::string kernel_base_name(std::string_view demangled);
// A readable name for tables: the base name with its template arguments, namespaces stripped and the weight
// format enum written out ("linear_mma_kernel<fp8, 1>", "moe_expert_kernel<mxfp4, 4, true>").
std::string kernel_display_name(std::string_view demangled);
// The demangled form of a mangled C++ name; a name that is not mangled comes back unchanged.
std::string demangle(const char* name);

struct KernelClass {
  OpCategory category = OpCategory::other;
  bool matched = false;  // false: no rule names this kernel, so it fell into "other"
};
KernelClass classify_kernel(std::string_view demangled);
inline OpCategory categorize_kernel(std::string_view demangled) { return classify_kernel(demangled).category; }

struct CategoryTime {
  int64_t count = 0, total_ns = 0, exposed_ns = 0;
};
struct CategorizedKernel {
  KernelTime time;
  OpCategory category = OpCategory::other;
  std::string display;  // kernel_display_name
};
struct ProfileReport {
  std::array<CategoryTime, kNumOpCategories> categories{};  // indexed by OpCategory
  std::vector<CategorizedKernel> kernels;                   // by total_ns, largest first
  int64_t total_ns = 0;                                     // summed over every kernel and copy
  bool has_exposure = false;                                // some record carries exposed time (expose())
  int64_t busy_ns = 0, span_ns = 0, dropped = 0, bad_timestamps = 0;
};
ProfileReport categorize(const ProfileRecords& records);
// Executions of every kernel, memcpy and memset of the report (the table's "total" row).
int64_t total_count(const ProfileReport& report);

// The table, per step (totals / steps): each category's time, share of the summed GPU time and executions;
// then the top `top` kernels; then GPU busy / wall (the GPU-side span), whose difference is launch gaps and
// host work. `what` names what a step is ("decode step") in the header line.
std::string format_report(const ProfileReport& report, int64_t steps, int top = 15,
                          std::string_view what = "step");
// The same figures as one JSON object (per step, microseconds).
std::string format_report_json(const ProfileReport& report, int64_t steps, int top = 15);

}  // namespace tern::cuda
