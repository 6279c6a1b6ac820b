#include "tools/http_options.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace tern::tools {

namespace {

std::chrono::milliseconds positive_seconds(double s, const char* name) {
  TERN_CHECK(s > 0, name, ": expected a positive number of seconds, found ", s);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

}  // namespace

void add_http_options(CLI::App& app, HttpOptions& o) {
  app.add_option("--body-limit-mb", o.body_limit_mb, "Largest request body")->capture_default_str();
  app.add_option("--header-timeout", o.header_timeout_s,
                 "Seconds to receive a request once started, and a new connection's first byte")
      ->capture_default_str();
  app.add_option("--idle-timeout", o.idle_timeout_s, "Seconds a keep-alive connection waits for its next request")
      ->capture_default_str();
  app.add_option("--max-connections", o.max_connections,
                 "Open connections at most, kept below the file limit; when full the oldest waiting one is closed, "
                 "or a new one gets 503")
      ->capture_default_str();
  app.add_option("--max-buffered-mb", o.max_buffered_mb,
                 "Request bodies held at once over all connections; beyond it a request gets 503 from its head")
      ->capture_default_str();
}

net::HttpLimits http_limits(const HttpOptions& o, size_t per_connection) {
  net::HttpLimits l;
  TERN_CHECK(o.body_limit_mb > 0, "--body-limit-mb must be positive");
  l.body_limit = static_cast<size_t>(o.body_limit_mb * (1 << 20));
  l.header_timeout = positive_seconds(o.header_timeout_s, "--header-timeout");
  l.idle_timeout = positive_seconds(o.idle_timeout_s, "--idle-timeout");
  TERN_CHECK(o.max_buffered_mb >= o.body_limit_mb, "--max-buffered-mb (", o.max_buffered_mb,
             ") must hold at least one body of --body-limit-mb (", o.body_limit_mb, ")");
  l.max_buffered = static_cast<size_t>(o.max_buffered_mb * (1 << 20));
  TERN_CHECK(o.max_connections >= 1, "--max-connections must be at least 1");
  const net::FileLimit files = net::raise_file_limit();
  l.max_connections = net::connections_within(files, o.max_connections, per_connection);
  log::info("file limit ", files.soft, files.was != files.soft ? cat(" (raised from ", files.was, ")") : std::string(),
            "; at most ", l.max_connections, " connections", l.max_connections < o.max_connections ? " (to stay below it)" : "",
            ", ", l.max_buffered >> 20, " MiB of request bodies");
  return l;
}

}  // namespace tern::tools
