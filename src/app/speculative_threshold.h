// `tern serve --speculative auto`'s threshold (docs/mtp.md, "The auto threshold"): the largest decode batch at which
// an MTP round (drafting, the verify step, settling) still costs less than the tokens it brings at the expected
// acceptance length, measured by `tern bench-step --speculative k --save-speculative-threshold` on this machine and
// kept per (device, model shape, k) in speculative-thresholds.json in the cache directory ($TERN_CACHE, else
// $XDG_CACHE_HOME/tern, else ~/.cache/tern). `tern serve` prints the value it uses and where it came from;
// --speculative-max-batch overrides it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/v4_model.h"

namespace tern::app {

struct SpeculativeThreshold {
  std::string device;  // "cpu" or the GPU's description
  std::string model;   // speculative_model_key()
  int k = 0;
  double acceptance_length = 0;  // the expected acceptance length the threshold was taken at
  double min_gain = 1.0;         // the least predicted gain (L / ratio) that counted as paying
  int64_t max_batch = 0;         // speculate while at most this many sequences decode; 0: never pays
  // The measurement behind it: per batch, round time / plain decode step time (it pays while below the length).
  std::vector<std::pair<int64_t, double>> ratios;
  std::string measured;  // when and with what (commit, context), for the startup line
};

// The model's shape as far as a step's cost goes (layers, hidden, experts, vocab, the routed experts' format).
std::string speculative_model_key(const model::Model& m);
// "cpu", or the CUDA device's description.
std::string speculative_device_key(const std::string& device);
std::string speculative_threshold_path();
// The default least predicted gain: a round whose predicted gain acceptance_length / ratio is below it does not count
// as paying. Why not 1.0: bench-step's round leaves out what a server adds (prompt steps interleaved with the rounds,
// the MTP layer's eager catch-up of each prompt); on the H100 (session 20) the server gave 0.94x of the predicted gain
// at one request (1.39x for 1.48x predicted) and lost 5% at 16 requests where 1.02x was predicted.
constexpr double kSpeculativeMinGain = 1.1;
// The largest batch whose predicted gain acceptance_length / ratio is at least `min_gain`, among consecutive measured
// batches from the smallest (0 when even the smallest does not pay).
int64_t threshold_from_ratios(const std::vector<std::pair<int64_t, double>>& ratios, double acceptance_length,
                              double min_gain = kSpeculativeMinGain);
// Adds or replaces the entry of (device, model, k) in `path`; throws naming the file when it cannot write.
void save_speculative_threshold(const SpeculativeThreshold& t, const std::string& path = speculative_threshold_path());
std::optional<SpeculativeThreshold> load_speculative_threshold(const std::string& device, const std::string& model, int k,
                                                               const std::string& path = speculative_threshold_path());

}  // namespace tern::app
