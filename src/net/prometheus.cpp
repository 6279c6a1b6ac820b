#include "net/prometheus.h"

#include <fmt/format.h>

namespace tern::net {

void prom_header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP tern:{} {}\n# TYPE tern:{} {}\n", name, help, name, type);
}

void prom_scalar(std::string& out, const char* name, const char* type, const char* help, double v, const std::string& labels) {
  prom_header(out, name, type, help);
  out += fmt::format("tern:{}{{{}}} {}\n", name, labels, v);
}

void prom_histogram_series(std::string& out, const char* name, const Histogram& h, const std::string& labels) {
  uint64_t cum = 0;
  for (size_t i = 0; i < h.counts().size(); ++i) {
    cum += h.counts()[i];
    const std::string le = i < h.bounds().size() ? fmt::format("{}", h.bounds()[i]) : "+Inf";
    out += fmt::format("tern:{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cum);
  }
  out += fmt::format("tern:{}_sum{{{}}} {}\ntern:{}_count{{{}}} {}\n", name, labels, h.sum(), name, labels, h.count());
}

void prom_histogram(std::string& out, const char* name, const char* help, const Histogram& h, const std::string& labels) {
  prom_header(out, name, "histogram", help);
  prom_histogram_series(out, name, h, labels);
}

std::string render_http_metrics(const HttpStats& h, const std::string& l) {
  std::string out;
  prom_scalar(out, "http_connections", "gauge", "Open HTTP connections.", double(h.open), l);
  prom_scalar(out, "http_connections_evicted_total", "counter",
              "Connections waiting for a request closed to make room for new ones (--max-connections).",
              double(h.evicted_total), l);
  prom_scalar(out, "http_connections_refused_total", "counter",
              "New connections answered 503: every open one was inside a request (--max-connections).",
              double(h.refused_total), l);
  prom_scalar(out, "http_requests_busy_total", "counter", "Requests answered 503 from their head: no body budget left "
              "(--max-buffered-mb).", double(h.busy_total), l);
  prom_scalar(out, "http_buffered_bytes", "gauge", "Request-body bytes reserved now (--max-buffered-mb).",
              double(h.buffered_bytes), l);
  return out;
}

}  // namespace tern::net
