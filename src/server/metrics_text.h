// /metrics: the engine's and the HTTP layer's numbers in Prometheus text format, prefixed `tern:`.
#pragma once

#include <cstdint>
#include <string>

#include "engine/metrics.h"
#include "server/http.h"
#include "transfer/pd_common.h"

namespace tern::server {

struct ServerCounters {
  uint64_t http_requests_total = 0;
  uint64_t http_errors_4xx_total = 0;
  uint64_t http_errors_5xx_total = 0;
  uint64_t client_disconnects_total = 0;
  uint64_t request_timeouts_total = 0;
  HttpStats http;  // the connection table and the request-body budget
  size_t admission_clients = 0;
};

// Prometheus text helpers (names get the `tern:` prefix; `labels` is `k="v",...`).
void prom_header(std::string& out, const char* name, const char* type, const char* help);
void prom_scalar(std::string& out, const char* name, const char* type, const char* help, double v, const std::string& labels);
void prom_histogram(std::string& out, const char* name, const char* help, const engine::Histogram& h,
                    const std::string& labels);

std::string render_metrics(const engine::EngineMetrics& m, const ServerCounters& s, const std::string& model);
// The HTTP layer's connection table and request-body budget (`tern serve` and `tern route`).
std::string render_http_metrics(const HttpStats& h, const std::string& labels);
// Prefill-decode transfers of a prefill or decode server (`side`).
std::string render_pd_metrics(const transfer::PdMetrics& m, const char* side, const std::string& model);

}  // namespace tern::server
