#include "net/http_options.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace tern::net {

namespace {

std::chrono::milliseconds positive_seconds(double s, const char* name) {
  TERN_CHECK(s > 0, name, ": expected a positive number of seconds, found ", s);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

}  // namespace

HttpLimits http_limits(const HttpOptions& o, size_t per_connection) {
  HttpLimits l;
  TERN_CHECK(o.body_limit_mb > 0, "--body-limit-mb must be positive");
  l.body_limit = static_cast<size_t>(o.body_limit_mb * (1 << 20));
  l.header_timeout = positive_seconds(o.header_timeout_s, "--header-timeout");
  l.idle_timeout = positive_seconds(o.idle_timeout_s, "--idle-timeout");
  TERN_CHECK(o.max_buffered_mb >= o.body_limit_mb, "--max-buffered-mb (", o.max_buffered_mb,
             ") must hold at least one body of --body-limit-mb (", o.body_limit_mb, ")");
  l.max_buffered = static_cast<size_t>(o.max_buffered_mb * (1 << 20));
  TERN_CHECK(o.max_connections >= 1, "--max-connections must be at least 1");
  const FileLimit files = raise_file_limit();
  l.max_connections = connections_within(files, o.max_connections, per_connection);
  log::info("file limit ", files.soft, files.was != files.soft ? cat(" (raised from ", files.was, ")") : std::string(),
            "; at most ", l.max_connections, " connections", l.max_connections < o.max_connections ? " (to stay below it)" : "",
            ", ", l.max_buffered >> 20, " MiB of request bodies");
  return l;
}

}  // namespace tern::net
