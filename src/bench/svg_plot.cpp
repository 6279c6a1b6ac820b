#include "bench/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace tern::bench {
namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr int kLeft = 64, kRight = 150, kTop = 34, kBottom = 48;

struct Axis {
  double lo, hi;
  bool log;
  double pixel_lo, pixel_hi;
  double map(double v) const {
    double a = log ? std::log10(std::max(v, 1e-12)) : v, b0 = log ? std::log10(lo) : lo,
           b1 = log ? std::log10(hi) : hi;
    double f = b1 > b0 ? (a - b0) / (b1 - b0) : 0.5;
    return pixel_lo + f * (pixel_hi - pixel_lo);
  }
};

std::string label(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-2)) return fmt::format("{:.0e}", v);
  return fmt::format("{:g}", v);
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  for (double p = std::pow(10, std::floor(std::log10(lo))); p <= hi * 1.0001; p *= 10)
    for (double m : {1.0, 2.0, 5.0})
      if (p * m >= lo * 0.9999 && p * m <= hi * 1.0001) ticks.push_back(p * m);
  return ticks;
}

void range_of(const std::vector<Series>& series, bool x, double& lo, double& hi) {
  lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series)
    for (double v : x ? s.x : s.y) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  // A flat or nearly flat series (equal means and medians) still gets a readable axis.
  if (hi - lo <= 1e-9 * std::max(std::fabs(lo), std::fabs(hi))) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1);
}

std::string frame(const PlotSpec& spec, const Axis& ax, const Axis& ay, const std::vector<double>& xt,
                  const std::vector<double>& yt) {
  std::string out;
  int w = spec.width, h = spec.height;
  out += fmt::format("<text x='{}' y='20' font-size='14' font-weight='bold' text-anchor='middle'>{}</text>",
                     (kLeft + w - kRight) / 2, xml_escape(spec.title));
  for (double t : yt) {
    double y = ay.map(t);
    out += fmt::format("<line x1='{}' x2='{}' y1='{:.1f}' y2='{:.1f}' stroke='#e5e5e5'/>", kLeft, w - kRight, y, y);
    out += fmt::format("<text x='{}' y='{:.1f}' font-size='11' text-anchor='end'>{}</text>", kLeft - 6, y + 4, label(t));
  }
  for (double t : xt) {
    double x = ax.map(t);
    out += fmt::format("<line x1='{:.1f}' x2='{:.1f}' y1='{}' y2='{}' stroke='#e5e5e5'/>", x, x, kTop, h - kBottom);
    out += fmt::format("<text x='{:.1f}' y='{}' font-size='11' text-anchor='middle'>{}</text>", x, h - kBottom + 16,
                       label(t));
  }
  out += fmt::format("<rect x='{}' y='{}' width='{}' height='{}' fill='none' stroke='#444'/>", kLeft, kTop,
                     w - kLeft - kRight, h - kTop - kBottom);
  out += fmt::format("<text x='{}' y='{}' font-size='12' text-anchor='middle'>{}</text>", (kLeft + w - kRight) / 2,
                     h - 10, xml_escape(spec.x_label));
  out += fmt::format("<text x='14' y='{}' font-size='12' text-anchor='middle' transform='rotate(-90 14 {})'>{}</text>",
                     (kTop + h - kBottom) / 2, (kTop + h - kBottom) / 2, xml_escape(spec.y_label));
  return out;
}

std::string legend(const PlotSpec& spec, const std::vector<Series>& series) {
  std::string out;
  for (std::size_t i = 0; i < series.size(); ++i) {
    int y = kTop + 8 + static_cast<int>(i) * 18;
    int x = spec.width - kRight + 12;
    out += fmt::format("<line x1='{}' x2='{}' y1='{}' y2='{}' stroke='{}' stroke-width='2.5'/>", x, x + 18, y, y,
                       kColors[i % 10]);
    out += fmt::format("<text x='{}' y='{}' font-size='11'>{}</text>", x + 24, y + 4, xml_escape(series[i].name));
  }
  return out;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  double span = hi - lo;
  if (span <= 0) return {lo};
  double raw = span / target, mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag * (raw / mag < 1.5 ? 1 : raw / mag < 3.5 ? 2 : raw / mag < 7.5 ? 5 : 10);
  std::vector<double> ticks;
  double first = std::ceil(lo / step - 1e-9);
  for (int k = 0; k < 100; ++k) {  // bounded, whatever rounding does
    double t = (first + k) * step;
    if (t > hi + step * 1e-9) break;
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

std::string line_plot(const PlotSpec& spec, const std::vector<Series>& series) {
  double xlo, xhi, ylo, yhi;
  range_of(series, true, xlo, xhi);
  range_of(series, false, ylo, yhi);
  bool log_x = spec.log_x && xlo > 0;
  std::vector<double> yt = nice_ticks(std::min(0.0, ylo), yhi);
  std::vector<double> xt = log_x ? log_ticks(xlo, xhi) : nice_ticks(xlo, xhi);
  // A sweep's own levels (1, 8, 16, ...) label a log axis better than 1-2-5 steps.
  if (log_x && series.size() && series.front().x.size() <= 8) xt = series.front().x;
  if (!log_x) xlo = std::min(xlo, xt.front()), xhi = std::max(xhi, xt.back());
  Axis ax{xlo, xhi, log_x, kLeft + 10.0, spec.width - kRight - 10.0};
  Axis ay{yt.front(), std::max(yt.back(), yhi), false, spec.height - static_cast<double>(kBottom), kTop + 0.0};
  std::string out = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
                                "font-family='sans-serif'>", spec.width, spec.height);
  out += frame(spec, ax, ay, xt, yt);
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    std::string points;
    for (std::size_t k = 0; k < s.x.size(); ++k) points += fmt::format("{:.1f},{:.1f} ", ax.map(s.x[k]), ay.map(s.y[k]));
    out += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='2'/>", points, kColors[i % 10]);
    if (s.markers)
      for (std::size_t k = 0; k < s.x.size(); ++k)
        out += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='3.5' fill='{}'/>", ax.map(s.x[k]), ay.map(s.y[k]),
                           kColors[i % 10]);
  }
  return out + legend(spec, series) + "</svg>";
}

std::string cdf_plot(const PlotSpec& spec, const std::vector<std::pair<std::string, std::vector<double>>>& samples) {
  std::vector<Series> series;
  for (const auto& [name, values] : samples) {
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    Series s{name, {}, {}, false};
    // At most ~400 points per curve keeps the file small for runs of many thousand requests.
    std::size_t step = std::max<std::size_t>(1, v.size() / 400);
    for (std::size_t i = 0; i < v.size(); i += step) {
      s.x.push_back(v[i]);
      s.y.push_back(static_cast<double>(i + 1) / static_cast<double>(v.size()));
    }
    if (!v.empty()) s.x.push_back(v.back()), s.y.push_back(1.0);
    series.push_back(std::move(s));
  }
  return line_plot(spec, series);
}

}  // namespace tern::bench
