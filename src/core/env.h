// Environment knobs (TERN_*): one reading of the environment and one set of rules for every variable (issue #17:
// a knob that ignores a value it does not know silently runs the default path, so a typo measures the wrong
// kernel). The table of every variable, its values and default is in docs/cuda-backend.md, "Environment knobs".
//
// The rules, the same for every helper: an unset variable, or one set to the empty string, takes the default;
// any other value must be one the knob accepts, else tern::Error naming the variable, the value found and what
// is accepted. The helpers read the environment at each call: a knob read once keeps its value in a static at
// the call site.
//
// No logging and no fmt here: the kernels' .cu files include this header, and nvcc compiles them as C++20.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace tern {

// The variable's value; nullopt when it is unset or empty.
std::optional<std::string> env_string(const char* name);

// A switch: 1, on, true or 0, off, false (any case); `dflt` when unset or empty; anything else throws.
bool env_flag(const char* name, bool dflt);

// A decimal integer (an optional '-', digits, nothing else) in [lo, hi]; `dflt` when unset or empty (not checked
// against the range: a default outside it, such as 0 for "the rule decides", is returned as it is); junk or a
// value out of range throws.
int64_t env_int(const char* name, int64_t dflt, int64_t lo, int64_t hi);

// One of `allowed` (exact, case-sensitive), returned as a string; `dflt` when unset or empty (name the default
// among `allowed` too, so that it can be asked for by name and the error lists it); anything else throws.
std::string env_choice(const char* name, std::initializer_list<std::string_view> allowed, std::string_view dflt);

}  // namespace tern
