// Prometheus text format (version 0.0.4) for /metrics: the helpers every exporter uses (metric names
// get the `tern:` prefix; `labels` is `k="v",...`), and the HTTP layer's own numbers (`tern serve` and
// `tern route`).
#pragma once

#include <string>

#include "core/histogram.h"
#include "net/http.h"

namespace tern::net {

void prom_header(std::string& out, const char* name, const char* type, const char* help);
void prom_scalar(std::string& out, const char* name, const char* type, const char* help, double v, const std::string& labels);
// A histogram family of one series: its header and the series.
void prom_histogram(std::string& out, const char* name, const char* help, const Histogram& h, const std::string& labels);
// One series of a histogram family whose header was written before (families of several series).
void prom_histogram_series(std::string& out, const char* name, const Histogram& h, const std::string& labels);

// The connection table and the request-body budget.
std::string render_http_metrics(const HttpStats& h, const std::string& labels);

}  // namespace tern::net
