// The `tern` command's verbs. Each verb lives in tools/verbs/<name>.cpp and registers itself:
//
//   static const bool registered = tern::tools::register_verb({"run", "Generate from token ids",
//       [](CLI::App& app) -> std::function<int()> { /* add options */ return [=] { return 0; }; }});
//
// setup() adds the verb's options to its CLI11 subcommand and returns the function that runs it
// (its return value is the exit code). A tern::Error thrown by it is printed and exits 1.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "app/device.h"

namespace tern::tools {

struct Verb {
  std::string name;
  std::string help;
  std::function<std::function<int()>(CLI::App&)> setup;
};

bool register_verb(Verb verb);
const std::vector<Verb>& verbs();

// Kernel options of the verbs that run a model (app/device.h: TuneOptions, configure_kernels).
inline void add_tune_options(CLI::App& app, app::TuneOptions& t) {
  app.add_option("--activations", t.activations,
                 "auto (fp8 on a GPU, native on the CPU), native (each backend's own: CPU f32, GPU bf16 tensor-core "
                 "operands) or fp8 (the official reference's: x quantised to e4m3 in 1x128 blocks with power-of-two "
                 "scales before each FP8 and FP4 product) or f32 (the exact mode: every product exact in f32, the GPU's "
                 "on its exact kernels; slow, for checks)")
      ->check(CLI::IsMember({"auto", "native", "fp8", "f32"}))
      ->capture_default_str();
  app.add_option("--tune", t.mode,
                 "off, cached or on: with --device cuda, run the linear kernels with the configurations measured "
                 "fastest on this GPU (cached: from the tuning file only; on: also measure what it lacks, a few "
                 "seconds, and save them)")
      ->check(CLI::IsMember({"off", "cached", "on"}))
      ->capture_default_str();
  app.add_flag("--batch-invariant", t.batch_invariant,
               "with --device cuda, run every product on tern's own kernels, so that a token's logits do not depend "
               "on what else shares its step (off: products of 512 tokens or more, prefill chunks, run on cuBLAS, and FP4 "
               "experts of steps over 64 tokens on the grouped tensor-core kernels)");
  app.add_option("--tune-cache", t.cache,
                 "the tuning file (default: $TERN_CACHE_DIR, $XDG_CACHE_HOME/tern or ~/.cache/tern, "
                 "tune-<gpu>.json)");
}

}  // namespace tern::tools
