#include "app/speculative_threshold.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "app/embedded_model.h"
#include "core/error.h"
#ifdef TERN_WITH_CUDA
#include "backends/cuda/device_memory.h"
#endif

namespace tern::app {

namespace {

using nlohmann::json;

json to_json(const SpeculativeThreshold& t) {
  json ratios = json::array();
  for (const auto& [batch, ratio] : t.ratios) ratios.push_back({{"batch", batch}, {"ratio", ratio}});
  return {{"device", t.device},       {"model", t.model},       {"k", t.k},
          {"acceptance_length", t.acceptance_length}, {"min_gain", t.min_gain}, {"max_batch", t.max_batch}, {"ratios", ratios},
          {"measured", t.measured}};
}

SpeculativeThreshold from_json(const json& j) {
  SpeculativeThreshold t;
  t.device = j.at("device").get<std::string>();
  t.model = j.at("model").get<std::string>();
  t.k = j.at("k").get<int>();
  t.acceptance_length = j.at("acceptance_length").get<double>();
  t.min_gain = j.value("min_gain", 1.0);  // entries saved before session 20 used the bare rule
  t.max_batch = j.at("max_batch").get<int64_t>();
  for (const auto& r : j.at("ratios")) t.ratios.emplace_back(r.at("batch").get<int64_t>(), r.at("ratio").get<double>());
  t.measured = j.value("measured", "");
  return t;
}

json read_all(const std::string& path) {
  if (!std::filesystem::exists(path)) return json::array();
  std::ifstream in(path);
  try {
    json j = json::parse(in);
    TERN_CHECK(j.is_array(), "not a JSON array");
    return j;
  } catch (const std::exception& e) {
    throw Error(cat(path, ": not a speculative threshold file (", e.what(), "); delete it and measure again"));
  }
}

}  // namespace

std::string speculative_model_key(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  const std::span<const ops::Expert> experts = m.routed_experts(0);
  const std::string format = experts.empty() ? "none" : std::string(ops::weight_format_name(experts.front().w1.format));
  return cat(c.num_layers, " layers, hidden ", c.hidden_size, ", ", c.n_routed_experts, " experts (", format,
             "), vocab ", c.vocab_size);
}

std::string speculative_device_key(const std::string& device) {
#ifdef TERN_WITH_CUDA
  if (device == "cuda") {
    // The description without what changes from run to run (its parenthesised free memory).
    std::string d = cuda::device_description();
    if (const size_t open = d.find(" ("); open != std::string::npos) d.erase(open);
    return d;
  }
#endif
  return device;
}

std::string speculative_threshold_path() { return (cache_root() / "speculative-thresholds.json").string(); }

int64_t threshold_from_ratios(const std::vector<std::pair<int64_t, double>>& ratios, double acceptance_length,
                              double min_gain) {
  TERN_CHECK(min_gain >= 1.0, "the least speculative gain must be at least 1 (got ", min_gain, ")");
  auto sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  int64_t best = 0;
  for (const auto& [batch, ratio] : sorted) {
    if (ratio >= acceptance_length || ratio * min_gain > acceptance_length) break;
    best = batch;
  }
  return best;
}

void save_speculative_threshold(const SpeculativeThreshold& t, const std::string& path) {
  json all = read_all(path);
  json kept = json::array();
  for (const auto& e : all)
    if (!(e.value("device", "") == t.device && e.value("model", "") == t.model && e.value("k", 0) == t.k))
      kept.push_back(e);
  kept.push_back(to_json(t));
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp);
    out << kept.dump(2) << "\n";
    TERN_CHECK(out.good(), "cannot write ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

std::optional<SpeculativeThreshold> load_speculative_threshold(const std::string& device, const std::string& model, int k,
                                                               const std::string& path) {
  for (const auto& e : read_all(path))
    if (e.value("device", "") == device && e.value("model", "") == model && e.value("k", 0) == k) return from_json(e);
  return std::nullopt;
}

}  // namespace tern::app
