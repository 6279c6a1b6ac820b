#include "backends/cuda/tune_table.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.h"
#include "core/error.h"

namespace tern::cuda {

using nlohmann::json;

TuneTable TuneTable::load(const std::string& path, const std::string& device) {
  TuneTable t(device);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return t;
  std::ifstream in(path);
  TERN_CHECK(in.good(), "tuning table ", path, ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  const std::string bad = cat("tuning table ", path, ": not a tern tuning table (delete it to measure again)");
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception&) {
    throw Error(bad);
  }
  TERN_CHECK(j.is_object() && j.contains("device") && j["device"].is_string() && j.contains("entries") &&
                 j["entries"].is_object(),
             bad);
  const std::string measured_on = j["device"].get<std::string>();
  TERN_CHECK(measured_on == device, "tuning table ", path, ": measured on \"", measured_on, "\", this is \"", device,
             "\" (delete it, or give --tune-cache another file, to measure here)");
  for (const auto& [key, e] : j["entries"].items()) {
    TERN_CHECK(e.is_object() && e.contains("choice") && e["choice"].is_number_integer() && e.contains("us") &&
                   e["us"].is_number() && e.contains("tried") && e["tried"].is_array(),
               bad, " (entry \"", key, "\")");
    TuneEntry entry;
    entry.choice = e["choice"].get<int>();
    entry.us = e["us"].get<double>();
    for (const auto& pair : e["tried"]) {
      TERN_CHECK(pair.is_array() && pair.size() == 2 && pair[0].is_number_integer() && pair[1].is_number(), bad,
                 " (entry \"", key, "\")");
      entry.tried.emplace_back(pair[0].get<int>(), pair[1].get<double>());
    }
    t.entries_[key] = std::move(entry);
  }
  return t;
}

void TuneTable::save(const std::string& path) const {
  json entries = json::object();
  for (const auto& [key, e] : entries_) {
    json tried = json::array();
    for (const auto& [choice, us] : e.tried) tried.push_back({choice, us});
    entries[key] = {{"choice", e.choice}, {"us", e.us}, {"tried", tried}};
  }
  const json j = {{"device", device_}, {"entries", entries}};
  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string temp = cat(path, ".", getpid(), ".tmp");
  {
    std::ofstream out(temp);
    out << j.dump(1) << "\n";
    TERN_CHECK(out.good(), "tuning table ", path, ": cannot be written (", temp, ")");
  }
  std::filesystem::rename(temp, target, ec);
  if (ec) {
    std::filesystem::remove(temp, ec);
    throw Error(cat("tuning table ", path, ": cannot be written (rename failed)"));
  }
}

const TuneEntry* TuneTable::find(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

TuneEntry TuneTable::fastest(std::span<const int> candidates, const std::function<double(int)>& us) {
  TERN_CHECK(!candidates.empty(), "tuning: no configuration to measure");
  TuneEntry e;
  for (const int c : candidates) {
    const double t = us(c);
    e.tried.emplace_back(c, t);
    if (e.tried.size() == 1 || t < e.us) {
      e.choice = c;
      e.us = t;
    }
  }
  return e;
}

std::string default_tune_path(const std::string& device) {
  std::string dir;
  if (const std::optional<std::string> d = env_string("TERN_CACHE_DIR")) {
    dir = *d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = cat(x, "/tern");
  } else {
    const char* home = std::getenv("HOME");
    dir = cat(home != nullptr && *home != '\0' ? home : "/tmp", "/.cache/tern");
  }
  std::string name;
  for (const char ch : device) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '-';
  return cat(dir, "/tune-", name, ".json");
}

}  // namespace tern::cuda
