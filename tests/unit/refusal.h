// The message of the tern::Error a call throws, for tests that check what a refusal says.
#pragma once

#include <string>

#include "core/error.h"

namespace tern::test {

// The message of the tern::Error that `f` throws ("" when it does not throw).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tern::test
