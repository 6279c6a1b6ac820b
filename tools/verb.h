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

namespace tern::tools {

struct Verb {
  std::string name;
  std::string help;
  std::function<std::function<int()>(CLI::App&)> setup;
};

bool register_verb(Verb verb);
const std::vector<Verb>& verbs();

}  // namespace tern::tools
