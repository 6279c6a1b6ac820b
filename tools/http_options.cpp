#include "tools/http_options.h"

namespace tern::tools {

void add_http_options(CLI::App& app, net::HttpOptions& o) {
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

}  // namespace tern::tools
