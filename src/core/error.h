// Errors that tell the user what went wrong and what to do about it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tern {

// The one exception type of tern. Its message names the thing that is wrong (file, tensor, field)
// with the expected and the found value; the `tern` command prints it and exits non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates any streamable values into one string (no fmt: this header compiles under nvcc).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

}  // namespace tern

// TERN_CHECK(cond, parts...): throws tern::Error with the concatenated parts when cond is false.
#define TERN_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) ::tern::fail(__VA_ARGS__);    \
  } while (0)
