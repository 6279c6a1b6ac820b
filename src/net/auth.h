// Bearer-token checks shared by `tern serve` and `tern route`.
#pragma once

#include <string>

namespace tern::net {

// True when `authorization` is "Bearer <key>" (compared in time independent of where they differ), or
// when no key is configured.
bool bearer_authorized(const std::string& authorization, const std::string& key);

}  // namespace tern::net
