// /metrics of `tern serve`: the engine's, the HTTP layer's and the transfers' numbers in Prometheus text
// format (net/prometheus.h), prefixed `tern:`.
#pragma once

#include <cstdint>
#include <string>

#include "engine/metrics.h"
#include "net/http.h"
#include "transfer/pd_common.h"

namespace tern::server {

struct ServerCounters {
  uint64_t http_requests_total = 0;
  uint64_t http_errors_4xx_total = 0;
  uint64_t http_errors_5xx_total = 0;
  uint64_t client_disconnects_total = 0;
  uint64_t request_timeouts_total = 0;
  net::HttpStats http;  // the connection table and the request-body budget
  size_t admission_clients = 0;
};

std::string render_metrics(const engine::EngineMetrics& m, const ServerCounters& s, const std::string& model);
// Prefill-decode transfers of a prefill or decode server (`side`).
std::string render_pd_metrics(const transfer::PdMetrics& m, const char* side, const std::string& model);

}  // namespace tern::server
