// Kernel tuning results, in plain C++ (built with or without CUDA, so CPU-only CI tests it): for a kernel
// and a shape, the configuration measured fastest on one GPU, with every configuration tried and its time.
// A table lives in a JSON file per device (default_tune_path) so that later starts reuse it instead of
// measuring again; the CUDA backend fills and applies it (CudaBackend::tune_linears, docs/cuda-backend.md,
// "Tuning").
//
//   {"device": "NVIDIA H200|sm_90|132 SMs", "entries": {"<key>": {"choice": 8, "us": 41.2,
//                                                                 "tried": [[1, 60.3], [2, 49.9], ...]}}}
//
// A key names the kernel and its version (a changed kernel gets new keys, so old measurements are never
// applied to it) and the shape.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tern::cuda {

struct TuneEntry {
  int choice = 0;    // the fastest configuration
  double us = 0;     // its time
  std::vector<std::pair<int, double>> tried;  // every configuration measured, in the order tried
};

class TuneTable {
 public:
  explicit TuneTable(std::string device) : device_(std::move(device)) {}
  // The table in `path` for `device`: empty when the file does not exist. Throws tern::Error naming the
  // file when it cannot be read, is not such a table, or was measured on another device (delete it, or
  // point --tune-cache elsewhere, to measure again).
  static TuneTable load(const std::string& path, const std::string& device);
  // Writes the table (a temporary file renamed over `path`, so a reader never sees half of it; the
  // folder is created). Throws tern::Error naming the file when it cannot.
  void save(const std::string& path) const;

  const std::string& device() const { return device_; }
  const TuneEntry* find(const std::string& key) const;
  void put(const std::string& key, TuneEntry entry) { entries_[key] = std::move(entry); }
  const std::map<std::string, TuneEntry>& entries() const { return entries_; }

  // Measures each candidate with `us(candidate)` and returns the fastest (the first of equal times).
  // Throws tern::Error when there is no candidate.
  static TuneEntry fastest(std::span<const int> candidates, const std::function<double(int)>& us);

 private:
  std::string device_;
  std::map<std::string, TuneEntry> entries_;
};

// Where a device's table lives: $TERN_CACHE_DIR, else $XDG_CACHE_HOME/tern, else $HOME/.cache/tern, then
// "tune-<device, letters and digits only>.json".
std::string default_tune_path(const std::string& device);

}  // namespace tern::cuda
