#include "app/knobs.h"

#include <charconv>

#include "core/error.h"
#if TERN_WITH_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

namespace tern::app {

namespace {
// The forward's on/off switches (Model::Paths; v4_model.h says what each selects).
struct PathSwitch {
  const char* name;
  bool model::Model::Paths::*member;
};
constexpr PathSwitch kPathSwitches[] = {
    {"TERN_HC_FOLD", &model::Model::Paths::hc_fold},
    {"TERN_FUSED_COMPRESS", &model::Model::Paths::fused_compress},
    {"TERN_FUSED_ROPE", &model::Model::Paths::fused_rope},
};

const PathSwitch* path_switch(const std::string& name) {
  for (const PathSwitch& sw : kPathSwitches)
    if (name == sw.name) return &sw;
  return nullptr;
}

// The forward's integer settings (Model::Paths), each 0 .. max.
struct PathNumber {
  const char* name;
  int model::Model::Paths::*member;
  int64_t max;
  const char* unit;  // what the value counts, for the refusal
};
constexpr PathNumber kPathNumbers[] = {
    {"TERN_L2_PREFETCH", &model::Model::Paths::l2_prefetch, model::Model::kPrefetchAll,
     "a sum of Model::L2Prefetch's bits"},
    {"TERN_HC_COMB_APART", &model::Model::Paths::hc_comb_apart, model::Model::kHcCombApartLimit, "tokens a step"},
};

const PathNumber* path_number(const std::string& name) {
  for (const PathNumber& n : kPathNumbers)
    if (name == n.name) return &n;
  return nullptr;
}
}  // namespace

std::vector<std::string> knob_names(const model::Model& m) {
  std::vector<std::string> names;
  for (const PathSwitch& sw : kPathSwitches) names.emplace_back(sw.name);
  for (const PathNumber& n : kPathNumbers) names.emplace_back(n.name);
#if TERN_WITH_CUDA
  if (m.device() == Device::cuda)
    for (const std::string& n : cuda::CudaBackend::knob_names()) names.push_back(n);
#else
  (void)m;
#endif
  return names;
}

namespace {

#if TERN_WITH_CUDA
cuda::CudaBackend* cuda_backend_of(const model::Model& m) {
  if (m.device() != Device::cuda) return nullptr;
  return &cuda::register_backend();
}
#endif

[[noreturn]] void unknown(const model::Model& m, const std::string& name) {
  std::string known;
  for (const std::string& k : knob_names(m)) known += (known.empty() ? "" : ", ") + k;
  fail("no switch named ", name, " on this model's device (known: ", known, ")");
}

}  // namespace

int64_t knob_value(const model::Model& m, const std::string& name) {
  if (const PathSwitch* sw = path_switch(name)) return m.paths().*sw->member;
  if (const PathNumber* n = path_number(name)) return m.paths().*n->member;
#if TERN_WITH_CUDA
  if (cuda::CudaBackend* b = cuda_backend_of(m)) return b->knob(name);
#endif
  unknown(m, name);
}

void set_knob(model::Model& m, const std::string& name, int64_t value) {
  if (const PathSwitch* sw = path_switch(name)) {
    TERN_CHECK(value == 0 || value == 1, name, " takes 0 or 1, not ", value);
    model::Model::Paths p = m.paths();
    p.*sw->member = value != 0;
    m.set_paths(p);
    return;
  }
  if (const PathNumber* n = path_number(name)) {
    TERN_CHECK(value >= 0 && value <= n->max, name, " takes 0 .. ", n->max, " (", n->unit, "), not ", value);
    model::Model::Paths p = m.paths();
    p.*n->member = static_cast<int>(value);
    m.set_paths(p);
    return;
  }
#if TERN_WITH_CUDA
  if (cuda::CudaBackend* b = cuda_backend_of(m)) {
    b->set_knob(name, value);
    return;
  }
#endif
  unknown(m, name);
}

std::vector<std::pair<std::string, int64_t>> parse_knobs(const std::string& text) {
  std::vector<std::pair<std::string, int64_t>> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t eq = item.find('=');
    int64_t v = 0;
    const char* end = item.data() + item.size();
    const bool ok = eq != std::string::npos && eq > 0 && eq + 1 < item.size() &&
                    std::from_chars(item.data() + eq + 1, end, v).ptr == end;
    TERN_CHECK(ok, "expected NAME=VALUE[,NAME=VALUE...] with integer values, found \"", item, "\" in \"",
               text, "\"");
    out.emplace_back(item.substr(0, eq), v);
    at = comma + 1;
  }
  return out;
}

}  // namespace tern::app
