// The `tern` command: dispatches to the verbs registered in tools/verbs/. A command built with one verb
// (tern-route) takes that verb's options directly.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>

#include "core/error.h"
#include "tools/verb.h"

namespace tern::tools {

static std::vector<Verb>& registry() {
  static std::vector<Verb> v;
  return v;
}

bool register_verb(Verb verb) {
  registry().push_back(std::move(verb));
  return true;
}

const std::vector<Verb>& verbs() { return registry(); }

}  // namespace tern::tools

int main(int argc, char** argv) {
  using namespace tern::tools;
  CLI::App app{"tern: an inference server for DeepSeek-V4-Flash"};
  app.set_version_flag("--version", "tern 0.1.0");
  auto sorted = verbs();
  std::sort(sorted.begin(), sorted.end(), [](const Verb& a, const Verb& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> runners;
  if (sorted.size() == 1) {  // a command of one verb (tern-route): the verb's options are the command's own
    app.description(sorted.front().help);
    runners.emplace_back(&app, sorted.front().setup(app));
  } else {
    app.require_subcommand(1);
    for (const auto& verb : sorted) {
      CLI::App* sub = app.add_subcommand(verb.name, verb.help);
      runners.emplace_back(sub, verb.setup(*sub));
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
  } catch (const tern::Error& e) {
    std::fprintf(stderr, "tern: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tern: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
