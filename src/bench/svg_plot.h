// Inline SVG line charts for the HTML report: no scripts, no fonts or files from the network.
#pragma once

#include <string>
#include <vector>

namespace tern::bench {

struct Series {
  std::string name;
  std::vector<double> x, y;
  bool markers = true;
};

struct PlotSpec {
  std::string title, x_label, y_label;
  bool log_x = false;  // concurrency levels 1, 8, 16, 32, 64 spread better on a log axis
  int width = 560, height = 340;
};

std::string line_plot(const PlotSpec& spec, const std::vector<Series>& series);
// Empirical CDF of each named sample (x: value, y: fraction of requests at or below it).
std::string cdf_plot(const PlotSpec& spec, const std::vector<std::pair<std::string, std::vector<double>>>& samples);
// Escapes &, <, >, " for HTML and SVG text.
std::string xml_escape(const std::string& text);
// "Nice" axis ticks (steps of 1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

}  // namespace tern::bench
