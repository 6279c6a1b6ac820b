// The HTTP front's options that `tern serve` and `tern route` share (body and header limits, timeouts, the
// connection table, the request-body budget), and the limits they make. (tools/http_options.h binds them to
// the command line.)
#pragma once

#include <cstddef>

#include "net/http.h"

namespace tern::net {

struct HttpOptions {
  double body_limit_mb = 8, header_timeout_s = 10, idle_timeout_s = 60;
  size_t max_connections = 4096;
  double max_buffered_mb = 256;
};

// The limits, checked; the file limit is raised to its hard limit and the connections kept below it
// (`per_connection` descriptors each: a router, or a prefill or decode server, opens more for each
// request). Logs the file limit and the connections.
HttpLimits http_limits(const HttpOptions& o, size_t per_connection);

}  // namespace tern::net
