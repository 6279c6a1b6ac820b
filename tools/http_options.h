// The HTTP front's options on the command line of `tern serve` and `tern route` (net/http_options.h: what they
// are and the limits they make).
#pragma once

#include <CLI/CLI.hpp>

#include "net/http_options.h"

namespace tern::tools {

void add_http_options(CLI::App& app, net::HttpOptions& o);

}  // namespace tern::tools
