// One plain GET to the server under test, outside the measured run: GET /v1/models (discover.h) and
// GET /metrics (server_metrics.h). The streaming client (client.h) is a different, timed path.
#pragma once

#include <string>

#include "bench/request.h"

namespace tern::bench {

struct HttpGetResult {
  int status = 0;  // the HTTP status; 0 when no answer came
  std::string body;
  std::string error;       // why no answer came: "cannot connect: Connection refused", ...
  bool timed_out = false;  // no complete answer within the deadline
  bool ok() const { return error.empty(); }
};

// GET `path` at the target's host and port, with its bearer key when it has one. One deadline covers
// the whole exchange, so a server that accepts and never answers cannot hang the caller. Never throws
// for network failures: they come back in `error` / `timed_out`.
HttpGetResult http_get(const Target& target, const std::string& path, const std::string& accept,
                       double timeout_s);

// "host:port" as a URL spells it (IPv6 hosts in brackets).
std::string authority_of(const Target& target);

}  // namespace tern::bench
