// The embedded default model of `tern run` and `tern serve`: ModelConfig::tiny() with synthetic weights
// (seed 1, MXFP4 experts) in the cache directory, written on first use. Concurrent first runs each write a
// temporary directory; the first rename wins.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "model/config.h"
#include "model/synth.h"

namespace tern::app {

// $TERN_CACHE, else $XDG_CACHE_HOME/tern, else ~/.cache/tern.
inline std::filesystem::path cache_root() {
  namespace fs = std::filesystem;
  if (const auto t = env_string("TERN_CACHE")) return *t;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "tern";
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/tmp") / ".cache" / "tern";
}

// The directory's name changes with the model's content, so a cache an older build wrote is not taken for it
// (session 16: "tiny-v4-mtp", the MTP layer added; "tiny-v4" before).
inline constexpr const char* kEmbeddedModelName = "tiny-v4-mtp";

inline std::string embedded_model_dir() {
  namespace fs = std::filesystem;
  const fs::path root = cache_root(), dir = root / kEmbeddedModelName;
  if (fs::exists(dir / "config.json")) return dir.string();
  std::fprintf(stderr, "making the embedded tiny model in %s (once)\n", dir.c_str());
  fs::create_directories(root);
  const fs::path tmp = root / cat(kEmbeddedModelName, ".tmp.", getpid());
  fs::remove_all(tmp);
  model::write_synthetic_checkpoint(model::ModelConfig::tiny(), tmp.string(), model::SynthOptions{});
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp);  // another process got there first
  return dir.string();
}

}  // namespace tern::app
