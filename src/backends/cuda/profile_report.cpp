#include "backends/cuda/profile_report.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "ops/weight_format.h"

namespace tern::cuda {

namespace {

enum class Match { exact, prefix, contains };

struct Rule {
  std::string_view pattern;
  Match how;
  OpCategory category;
};

// Kernel base name -> category; the first rule that matches wins. Every kernel of src/backends/cuda/kernels
// is named here on purpose (test_profile_report checks that none falls through to "other" unnamed); the
// family prefixes also take new kernels of a family.
constexpr Rule kRules[] = {
    // Sparse attention over window + compressed rows, its split combine, and the KV row pack / unpack
    // (the attention's cache rows; the compressor's emitted rows use kv_pack too).
    {"attention_", Match::prefix, OpCategory::attention},
    {"kv_pack_kernel", Match::exact, OpCategory::attention},
    {"kv_unpack_kernel", Match::exact, OpCategory::attention},
    // Decode steps: each slot's new row into its ring or compressed rows (the attention's cache rows).
    {"store_rows_kernel", Match::exact, OpCategory::attention},
    {"flash", Match::prefix, OpCategory::attention},  // FlashMLA-style kernels, if one is adopted
    // Lightning indexer: scores and top-k.
    {"indexer_", Match::prefix, OpCategory::indexer},
    // Compressor's online accumulators (and at decode compressor_emit_kernel: the entry's norm, RoPE, packing
    // and store in the same launch).
    {"compressor_", Match::prefix, OpCategory::compressor},
    // Routed experts with their routing (scored / hash), plan and combine; the FP4 decode experts on the
    // bulk-copy ring (moe_bulk_kernel<fmt, up>) and the register kernel (moe_expert_kernel<fmt, NT, up>).
    {"moe_bulk_kernel", Match::exact, OpCategory::moe},
    {"moe_", Match::prefix, OpCategory::moe},
    {"route_", Match::prefix, OpCategory::moe},
    // Dense products: every linear kernel (tensor-core and exact paths), and library GEMMs (cuBLAS(Lt)
    // kernels are named *gemm* or nvjet_*).
    {"linear_", Match::prefix, OpCategory::dense_gemm},
    {"l2_prefetch_kernel", Match::exact, OpCategory::dense_gemm},  // dense weights asked into L2 ahead (prefetch.cu)
    {"nvjet", Match::prefix, OpCategory::dense_gemm},
    {"gemm", Match::contains, OpCategory::dense_gemm},
    // The library GEMMs' operands (kernels/gemm_prep.cu): weights expanded to bf16 / f32, x rounded to bf16.
    // (The MoE's library products are cuBLAS kernels too, so a prefill's "dense gemm" holds them; its
    // moe_expand / moe_gather / moe_swiglu kernels count as moe.)
    {"expand_kernel", Match::exact, OpCategory::dense_gemm},
    {"round_bf16_kernel", Match::exact, OpCategory::dense_gemm},
    {"split_bf16x3_kernel", Match::exact, OpCategory::dense_gemm},  // x in three bf16 planes: the exact path
    // --activations fp8: x quantised 1x128 before each FP8 product; the weight scales as f32 for cuBLASLt.
    {"act_quant_kernel", Match::exact, OpCategory::dense_gemm},
    {"act_dequant_kernel", Match::exact, OpCategory::dense_gemm},
    {"act_fake_quant_bf16_kernel", Match::exact, OpCategory::moe},  // the experts' h on the prefill paths: rows
    {"act_fake_quant_bf16_planes_kernel", Match::exact, OpCategory::moe},  // or the grouped kernels' planes
    {"block_scales_f32_kernel", Match::exact, OpCategory::dense_gemm},
    // mHC (mixing, Sinkhorn, collapse, post-mix, stream expansion), RMS norms, RoPE.
    {"hc_", Match::prefix, OpCategory::mhc_norm_rope},
    {"rms_norm", Match::prefix, OpCategory::mhc_norm_rope},
    {"norm_rope", Match::prefix, OpCategory::mhc_norm_rope},  // rms_norm then RoPE in one launch
    {"rope", Match::prefix, OpCategory::mhc_norm_rope},
    // Sampling on the device (kernels/sampling.cu: sample_rows_kernel).
    {"sample", Match::prefix, OpCategory::sampling},
    {"sampling", Match::prefix, OpCategory::sampling},
    {"argmax", Match::prefix, OpCategory::sampling},
    // Named on purpose as "other": the embedding lookup, the shared expert's SwiGLU and residual add,
    // the head's row gather, and weight dequantization (not on the decode path).
    {"embedding_kernel", Match::exact, OpCategory::other},
    {"add_kernel", Match::exact, OpCategory::other},
    {"swiglu_kernel", Match::exact, OpCategory::other},
    {"gather_rows_kernel", Match::exact, OpCategory::other},
    {"dequantize_kernel", Match::exact, OpCategory::other},
    // The synthetic model's weight fill (kernels/synth.cu: bench-step and serve --synthetic, before any step).
    {"synth_", Match::prefix, OpCategory::other},
    // Random operands of the library-rate benchmark (bench-step's prefill GEMM table).
    {"fill_random_bf16_kernel", Match::exact, OpCategory::other},
    {"fill_random_e4m3_kernel", Match::exact, OpCategory::other},
    // Read-bandwidth probes of the micro-benchmark (kernels/read_probe.cu: tern_gpu_bench --only probe).
    {"bulk_read_kernel", Match::exact, OpCategory::other},
    {"ldg_read_kernel", Match::exact, OpCategory::other},
    {"tile_read_kernel", Match::exact, OpCategory::other},
    {"fp4_decode_probe_kernel", Match::exact, OpCategory::other},  // kernels/fp4_decode_probe.cu (--only decode_probe)
    // The empty kernel that ends programmatic overlap after the synthetic weight fill (kernels/launch.cu).
    {"pdl_fence_kernel", Match::exact, OpCategory::other},
    {"wgmma_probe_kernel", Match::exact, OpCategory::other},  // the wgmma layout probe (tests only)
};

bool matches(const Rule& r, std::string_view base) {
  switch (r.how) {
    case Match::exact: return base == r.pattern;
    case Match::prefix: return base.starts_with(r.pattern);
    case Match::contains: return base.find(r.pattern) != std::string_view::npos;
  }
  return false;
}

// Index of the bracket that opens the group ending at s[end] (s[end] is `close`), or npos.
size_t matching_open(std::string_view s, size_t end, char open, char close) {
  int depth = 0;
  for (size_t i = end + 1; i-- > 0;) {
    if (s[i] == close) ++depth;
    if (s[i] == open && --depth == 0) return i;
  }
  return std::string_view::npos;
}

// Splits "R ns::name<targs>(params)" into the qualified name and "<targs>" (empty without).
void split_name(std::string_view s, std::string_view& qualified, std::string_view& targs) {
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (!s.empty() && s.back() == ')') {
    const size_t open = matching_open(s, s.size() - 1, '(', ')');
    if (open != std::string_view::npos && open > 0) s = s.substr(0, open);
  }
  targs = {};
  if (!s.empty() && s.back() == '>') {
    const size_t open = matching_open(s, s.size() - 1, '<', '>');
    if (open != std::string_view::npos && open > 0) {
      targs = s.substr(open);
      s = s.substr(0, open);
    }
  }
  const size_t colons = s.rfind("::");
  if (colons != std::string_view::npos) {
    s = s.substr(colons + 2);
  } else {
    const size_t space = s.rfind(' ');  // the return type of a template function
    if (space != std::string_view::npos) s = s.substr(space + 1);
  }
  qualified = s;
}

// A kernel's template argument (ops::WeightFormat)i by a short name ("fp8" for fp8_block, as the kernel tables
// in docs/ write it); empty past the enum.
std::string_view format_display_name(size_t i) {
  if (i > static_cast<size_t>(ops::WeightFormat::nvfp4)) return {};
  const auto f = static_cast<ops::WeightFormat>(i);
  return f == ops::WeightFormat::fp8_block ? std::string_view("fp8") : ops::weight_format_name(f);
}

std::string per_step(int64_t ns, int64_t steps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(ns) / 1e3 / static_cast<double>(steps));
  return buf;
}

std::string share(int64_t ns, int64_t total) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", total > 0 ? 100.0 * static_cast<double>(ns) / static_cast<double>(total) : 0.0);
  return buf;
}

std::string count_per_step(int64_t count, int64_t steps) {
  char buf[32];
  const double v = static_cast<double>(count) / static_cast<double>(steps);
  std::snprintf(buf, sizeof buf, v == static_cast<double>(static_cast<int64_t>(v)) ? "%.0f" : "%.2f", v);
  return buf;
}

}  // namespace

std::string_view category_name(OpCategory c) {
  switch (c) {
    case OpCategory::attention: return "attention";
    case OpCategory::indexer: return "indexer";
    case OpCategory::compressor: return "compressor";
    case OpCategory::moe: return "moe experts";
    case OpCategory::dense_gemm: return "dense gemm";
    case OpCategory::mhc_norm_rope: return "mhc/norm/rope";
    case OpCategory::sampling: return "sampling";
    case OpCategory::memcpy: return "memcpy/memset";
    case OpCategory::other: return "other";
  }
  return "other";
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

std::string kernel_base_name(std::string_view demangled) {
  if (demangled.starts_with("[")) return std::string(demangled);
  std::string_view q, t;
  split_name(demangled, q, t);
  return std::string(q);
}

std::string kernel_display_name(std::string_view demangled) {
  if (demangled.starts_with("[")) return std::string(demangled);
  std::string_view q, t;
  split_name(demangled, q, t);
  std::string targs(t);
  static const std::regex anon(R"(\(anonymous namespace\)::)"), qualifier(R"([A-Za-z_][A-Za-z0-9_]*::)"),
      wfmt(R"(\(WeightFormat\)([0-9]+))");
  targs = std::regex_replace(targs, anon, "");
  targs = std::regex_replace(targs, qualifier, "");
  std::string out;
  std::smatch m;
  while (std::regex_search(targs, m, wfmt)) {
    const size_t i = std::stoul(m[1].str());
    out += m.prefix().str();
    const std::string_view name = format_display_name(i);
    out += name.empty() ? m[0].str() : std::string(name);
    targs = m.suffix().str();
  }
  return std::string(q) + out + targs;
}

KernelClass classify_kernel(std::string_view demangled) {
  if (demangled.starts_with("[memcpy") || demangled.starts_with("[memset")) return {OpCategory::memcpy, true};
  const std::string base = kernel_base_name(demangled);
  for (const Rule& r : kRules)
    if (matches(r, base)) return {r.category, true};
  return {OpCategory::other, false};
}

std::vector<int64_t> expose(std::vector<ActivitySpan> spans, size_t owners) {
  std::vector<int64_t> exposed(owners, 0);
  std::sort(spans.begin(), spans.end(), [](const ActivitySpan& a, const ActivitySpan& b) {
    return a.end != b.end ? a.end < b.end : a.start < b.start;
  });
  uint64_t last = 0;  // the latest end so far (0 before the first span: timestamps are never 0)
  for (const ActivitySpan& a : spans) {
    TERN_CHECK(a.owner >= 0 && static_cast<size_t>(a.owner) < owners, "cuda::expose: owner ", a.owner,
               " out of range (", owners, " owners)");
    const uint64_t from = std::max(a.start, last);
    if (a.end > from) exposed[static_cast<size_t>(a.owner)] += static_cast<int64_t>(a.end - from);
    last = std::max(last, a.end);
  }
  return exposed;
}

ProfileReport categorize(const ProfileRecords& records) {
  ProfileReport r;
  r.busy_ns = records.busy_ns;
  r.span_ns = records.span_ns;
  r.dropped = records.dropped;
  r.bad_timestamps = records.bad_timestamps;
  for (const KernelTime& k : records.kernels) {
    const OpCategory c = categorize_kernel(k.name);
    CategoryTime& ct = r.categories[static_cast<int>(c)];
    ct.count += k.count;
    ct.total_ns += k.total_ns;
    ct.exposed_ns += k.exposed_ns;
    r.total_ns += k.total_ns;
    r.has_exposure = r.has_exposure || k.exposed_ns > 0;
    r.kernels.push_back(CategorizedKernel{k, c, kernel_display_name(k.name)});
  }
  std::stable_sort(r.kernels.begin(), r.kernels.end(), [](const CategorizedKernel& a, const CategorizedKernel& b) {
    return a.time.total_ns > b.time.total_ns;
  });
  return r;
}

int64_t total_count(const ProfileReport& r) {
  int64_t count = 0;
  for (const CategoryTime& c : r.categories) count += c.count;
  return count;
}

std::string format_report(const ProfileReport& r, int64_t steps, int top, std::string_view what) {
  steps = std::max<int64_t>(steps, 1);
  std::string s;
  const std::string per = std::string(what);
  s += "GPU profile (CUPTI activity records), per " + per + ", " + std::to_string(steps) + " " + per +
       (steps == 1 ? "" : "s") + ":\n";
  const bool ex = r.has_exposure;
  s += "| category | us/" + per + " | share | kernels/" + per + " |" + (ex ? " exposed us/" + per + " |" : "") +
       "\n|---|---:|---:|---:|" + (ex ? "---:|" : "") + "\n";
  for (int i = 0; i < kNumOpCategories; ++i) {
    const CategoryTime& c = r.categories[i];
    s += "| " + std::string(category_name(static_cast<OpCategory>(i))) + " | " + per_step(c.total_ns, steps) + " | " +
         share(c.total_ns, r.total_ns) + " | " + count_per_step(c.count, steps) + " |" +
         (ex ? " " + per_step(c.exposed_ns, steps) + " |" : "") + "\n";
  }
  const int64_t count = total_count(r);
  int64_t exposed = 0;
  for (const CategoryTime& c : r.categories) exposed += c.exposed_ns;
  s += "| total | " + per_step(r.total_ns, steps) + " | " + share(r.total_ns, r.total_ns) + " | " +
       count_per_step(count, steps) + " |" + (ex ? " " + per_step(exposed, steps) + " |" : "") + "\n\n";
  s += "GPU busy " + per_step(r.busy_ns, steps) + " us of " + per_step(r.span_ns, steps) + " us wall per " + per +
       " (" + share(r.busy_ns, r.span_ns) +
       "; wall = first GPU activity start to last end; the rest is launch gaps, host work and syncs)\n";
  if (ex)
    s += "exposed: the part of a kernel's time that no earlier-ending activity covers (by how much it moved the "
         "GPU's last end); on one stream (TERN_SIDE_STREAM=0) with PDL, its cost on the step's path\n";
  if (r.dropped > 0)
    s += "WARNING: CUPTI dropped " + std::to_string(r.dropped) + " activity records: the times above are too low\n";
  if (r.bad_timestamps > 0)
    s += "WARNING: " + std::to_string(r.bad_timestamps) + " records had no valid timestamps and are left out\n";
  const auto table = [&](const std::vector<const CategorizedKernel*>& rows, const std::string& title) {
    s += "\ntop " + std::to_string(rows.size()) + " kernels by " + title + ":\n";
    s += "| kernel | category | us/" + per + " | share | calls/" + per + " | us/call |" +
         (ex ? " exposed us/" + per + " | exposed us/call |" : "") + "\n|---|---|---:|---:|---:|---:|" +
         (ex ? "---:|---:|" : "") + "\n";
    for (const CategorizedKernel* k : rows) {
      const int64_t calls = std::max<int64_t>(k->time.count, 1);
      s += "| " + k->display + " | " + std::string(category_name(k->category)) + " | " +
           per_step(k->time.total_ns, steps) + " | " + share(k->time.total_ns, r.total_ns) + " | " +
           count_per_step(k->time.count, steps) + " | " + per_step(k->time.total_ns, calls) + " |" +
           (ex ? " " + per_step(k->time.exposed_ns, steps) + " | " + per_step(k->time.exposed_ns, calls) + " |" : "") +
           "\n";
    }
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top, 0)), r.kernels.size());
  std::vector<const CategorizedKernel*> rows;
  for (size_t i = 0; i < n; ++i) rows.push_back(&r.kernels[i]);
  table(rows, "GPU time");
  if (ex) {  // what the step waits for, which own times do not order (PDL's waits inflate the short kernels')
    rows.clear();
    for (const CategorizedKernel& k : r.kernels) rows.push_back(&k);
    std::stable_sort(rows.begin(), rows.end(), [](const CategorizedKernel* a, const CategorizedKernel* b) {
      return a->time.exposed_ns > b->time.exposed_ns;
    });
    rows.resize(n);
    table(rows, "exposed time");
  }
  return s;
}

std::string format_report_json(const ProfileReport& r, int64_t steps, int top) {
  steps = std::max<int64_t>(steps, 1);
  const auto us = [&](int64_t ns) { return static_cast<double>(ns) / 1e3 / static_cast<double>(steps); };
  const auto frac = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  nlohmann::json j;
  j["steps"] = steps;
  j["total_us_per_step"] = us(r.total_ns);
  j["gpu_busy_us_per_step"] = us(r.busy_ns);
  j["has_exposure"] = r.has_exposure;
  j["wall_us_per_step"] = us(r.span_ns);
  j["busy_fraction"] = frac(r.busy_ns, r.span_ns);
  j["dropped_records"] = r.dropped;
  j["bad_timestamps"] = r.bad_timestamps;
  j["categories"] = nlohmann::json::array();
  for (int i = 0; i < kNumOpCategories; ++i) {
    const CategoryTime& c = r.categories[i];
    j["categories"].push_back({{"name", category_name(static_cast<OpCategory>(i))},
                               {"us_per_step", us(c.total_ns)},
                               {"share", frac(c.total_ns, r.total_ns)},
                               {"exposed_us_per_step", us(c.exposed_ns)},
                               {"kernels_per_step", static_cast<double>(c.count) / static_cast<double>(steps)}});
  }
  j["kernels"] = nlohmann::json::array();
  const int n = std::min<int>(top, static_cast<int>(r.kernels.size()));
  for (int i = 0; i < n; ++i) {
    const CategorizedKernel& k = r.kernels[i];
    j["kernels"].push_back({{"name", k.display},
                            {"demangled", k.time.name},
                            {"category", category_name(k.category)},
                            {"us_per_step", us(k.time.total_ns)},
                            {"share", frac(k.time.total_ns, r.total_ns)},
                            {"exposed_us_per_step", us(k.time.exposed_ns)},
                            {"calls_per_step", static_cast<double>(k.time.count) / static_cast<double>(steps)},
                            {"graph_calls_per_step", static_cast<double>(k.time.graph_count) / static_cast<double>(steps)}});
  }
  return j.dump(2);
}

}  // namespace tern::cuda
