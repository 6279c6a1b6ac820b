#include "bench/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace tern::bench {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t';
}
bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool name_char(char c) {
  return name_start(c) || (c >= '0' && c <= '9');
}

// A cursor over one line; every read returns false on anything the format does not allow.
class Line {
 public:
  explicit Line(std::string_view s) : s_(s) {}
  bool skip_spaces() {  // whether there was any
    std::size_t start = i_;
    while (i_ < s_.size() && is_space(s_[i_])) ++i_;
    return i_ > start;
  }
  bool at_end() const { return i_ == s_.size(); }
  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  // Metric names may hold ':', label names may not (colons = false).
  bool name(std::string& out, bool colons) {
    std::size_t start = i_;
    auto ok = [&](char c, bool first) {
      return (first ? name_start(c) : name_char(c)) && (colons || c != ':');
    };
    while (i_ < s_.size() && ok(s_[i_], i_ == start)) ++i_;
    out.assign(s_.substr(start, i_ - start));
    return i_ > start;
  }
  // A double-quoted label value with the format's three escapes (\\, \", \n).
  bool quoted(std::string& out) {
    if (!eat('"')) return false;
    out.clear();
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c == '\\' && i_ < s_.size()) {
        char e = s_[i_++];
        out += e == 'n' ? '\n' : e;
      } else {
        out += c;
      }
    }
    return false;  // no closing quote
  }
  std::string_view token() {
    std::size_t start = i_;
    while (i_ < s_.size() && !is_space(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0;
};

// Go's strconv.ParseFloat spellings that Prometheus writes: decimals, exponents, NaN, +Inf, -Inf.
std::optional<double> parse_value(std::string_view t) {
  if (t == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (t == "+Inf" || t == "Inf") return std::numeric_limits<double>::infinity();
  if (t == "-Inf") return -std::numeric_limits<double>::infinity();
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);  // from_chars takes no '+'
  double v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || t.empty()) return std::nullopt;
  return v;
}

bool parse_labels(Line& line, std::map<std::string, std::string>& labels) {
  for (;;) {
    line.skip_spaces();
    if (line.eat('}')) return true;  // also ends "{}" and a trailing comma
    std::string key, value;
    if (!line.name(key, false)) return false;
    line.skip_spaces();
    if (!line.eat('=')) return false;
    line.skip_spaces();
    if (!line.quoted(value)) return false;
    labels[key] = std::move(value);
    line.skip_spaces();
    if (line.eat(',')) continue;
    if (line.eat('}')) return true;
    return false;
  }
}

std::optional<PromSample> parse_sample(std::string_view text) {
  Line line(text);
  PromSample s;
  if (!line.name(s.name, true)) return std::nullopt;
  bool spaced = line.skip_spaces();
  if (line.eat('{')) {
    if (!parse_labels(line, s.labels)) return std::nullopt;
    spaced = line.skip_spaces();
  }
  if (!spaced) return std::nullopt;  // the value is a separate token
  std::optional<double> v = parse_value(line.token());
  if (!v) return std::nullopt;
  s.value = *v;
  line.skip_spaces();
  if (!line.at_end()) {  // an optional timestamp in ms, which a sum does not need
    std::string_view ts = line.token();
    long long ms = 0;
    auto [end, ec] = std::from_chars(ts.data(), ts.data() + ts.size(), ms);
    if (ec != std::errc() || end != ts.data() + ts.size()) return std::nullopt;
    line.skip_spaces();
    if (!line.at_end()) return std::nullopt;
  }
  return s;
}

}  // namespace

PromText parse_prometheus_text(std::string_view text) {
  PromText out;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    while (!line.empty() && (is_space(line.back()) || line.back() == '\r')) line.remove_suffix(1);
    while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
    if (line.empty() || line.front() == '#') continue;
    if (auto sample = parse_sample(line))
      out.samples.push_back(std::move(*sample));
    else
      ++out.skipped_lines;
  }
  return out;
}

std::optional<double> PromText::sum(std::string_view name) const {
  std::optional<double> total;
  for (const auto& s : samples)
    if (s.name == name) total = total.value_or(0) + s.value;
  return total;
}

std::map<std::string, double> PromText::sum_by(std::string_view name, std::string_view label) const {
  std::map<std::string, double> out;
  for (const auto& s : samples) {
    if (s.name != name) continue;
    auto it = s.labels.find(std::string(label));
    if (it != s.labels.end()) out[it->second] += s.value;
  }
  return out;
}

std::optional<double> PromText::mean(std::string_view name) const {
  double total = 0;
  int n = 0;
  for (const auto& s : samples)
    if (s.name == name) total += s.value, ++n;
  if (n == 0) return std::nullopt;
  return total / n;
}

}  // namespace tern::bench
