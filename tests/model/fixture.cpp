#include "fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

namespace tern::test {

std::vector<std::string> Fixture::names() {
  return {"tiny-mxfp4", "tiny-nvfp4"};
}

const Fixture& Fixture::get(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  std::lock_guard lock(mu);
  auto& slot = cache[name];
  if (!slot) {
    auto f = std::make_unique<Fixture>();
    // TERN_FIXTURES overrides the build-time path (binaries carried to another machine).
    const char* env = std::getenv("TERN_FIXTURES");
    const std::string dir = std::string(env && *env ? env : TERN_FIXTURES_DIR) + "/" + name;
    f->name_ = name;
    f->weights_ = model::load_model(dir);
    f->ref_ = model::SafetensorsFile::open(dir + "/reference.safetensors");
    if (std::filesystem::exists(dir + "/mtp_reference.safetensors"))
      f->mtp_ref_ = model::SafetensorsFile::open(dir + "/mtp_reference.safetensors");
    if (std::filesystem::exists(dir + "/act_fp8_reference.safetensors"))
      f->act_fp8_ref_ = model::SafetensorsFile::open(dir + "/act_fp8_reference.safetensors");
    f->dir_ = dir;
    TERN_CHECK(f->num_prompts() > 0, dir, "/reference.safetensors has no prompts");
    slot = std::move(f);
  }
  return *slot;
}

TensorView Fixture::tensor(const std::string& key) const {
  const model::SafetensorsEntry* e = ref_->find(key);
  return e ? ref_->view(*e) : TensorView();
}

TensorView Fixture::act_fp8_tensor(const std::string& key) const {
  const model::SafetensorsEntry* e = act_fp8_ref_ ? act_fp8_ref_->find(key) : nullptr;
  return e ? act_fp8_ref_->view(*e) : TensorView();
}

TensorView Fixture::mtp_tensor(const std::string& key) const {
  const model::SafetensorsEntry* e = mtp_ref_ ? mtp_ref_->find(key) : nullptr;
  return e ? mtp_ref_->view(*e) : TensorView();
}

static std::vector<int64_t> ints(const TensorView& v) {
  TERN_CHECK(!v.empty() && v.dtype() == DType::i64, "fixture: missing i64 tensor");
  return {v.data_as<const int64_t>(), v.data_as<const int64_t>() + v.numel()};
}

int Fixture::num_prompts(const std::string& set) const {
  int n = 0;
  while (ref_->find(set + "." + std::to_string(n) + ".ids")) ++n;
  return n;
}
std::vector<int64_t> Fixture::ids(int prompt, const std::string& set) const {
  return ints(tensor(set + "." + std::to_string(prompt) + ".ids"));
}
std::vector<int64_t> Fixture::greedy(int prompt, const std::string& set) const {
  return ints(tensor(set + "." + std::to_string(prompt) + ".greedy"));
}

bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
  return true;
#endif
#endif
  return false;
}

std::vector<int> prompts_to_run(const Fixture& f) {
  std::vector<int> out;
  for (int p = 0; p < f.num_prompts(); ++p)
    if (!sanitized_build() || p % 3 == 0 || p == f.num_prompts() - 1) out.push_back(p);
  return out;
}

Diff diff(const float* got, const float* want, int64_t n) {
  Diff d;
  for (int64_t i = 0; i < n; ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(got[i] - want[i]));
    if (std::isnan(got[i])) d.max_abs = INFINITY;
    d.ref_max = std::max(d.ref_max, std::fabs(want[i]));
  }
  return d;
}

}  // namespace tern::test
