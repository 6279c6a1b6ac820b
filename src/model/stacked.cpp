#include "model/stacked.h"

#include "core/error.h"

namespace tern::model {

std::string stack_refusal(const Linear& a, const Linear& b) {
  const std::string what = cat(a.name, " and ", b.name);
  if (a.format != b.format)
    return cat(what, " differ in format (", weight_format_name(a.format), ", ", weight_format_name(b.format), ")");
  if (a.in != b.in) return cat(what, " read inputs of ", a.in, " and ", b.in, " columns");
  if (a.weight.dtype() != b.weight.dtype() || a.scale.dtype() != b.scale.dtype() || a.scale.empty() != b.scale.empty())
    return cat(what, " store their tensors in different dtypes");
  if (a.global_scale != b.global_scale) return cat(what, " have different global scales");
  if (a.format == WeightFormat::fp8_block && a.out % 128 != 0)
    return cat(what, ": ", a.out, " rows of ", a.name, " would split a 128-row FP8 scale block at the join");
  return {};
}

namespace {

// "layers.0.attn.wq_a.weight" and "layers.0.attn.wkv.weight" -> "layers.0.attn.wq_a+wkv.weight": the common
// prefix (up to a dot) and the ".weight" suffix once, so reports that shorten names keep working.
std::string stacked_name(const std::string& a, const std::string& b) {
  size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  const size_t dot = a.rfind('.', common == 0 ? 0 : common - 1);
  const size_t keep = dot == std::string::npos || dot >= common ? 0 : dot + 1;
  std::string x = a.substr(keep), y = b.substr(keep);
  const std::string suffix = ".weight";
  const auto ends = [&](const std::string& s) {
    return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool both = ends(x) && ends(y);
  if (both) x.resize(x.size() - suffix.size()), y.resize(y.size() - suffix.size());
  return cat(a.substr(0, keep), x, "+", y, both ? suffix : "");
}

}  // namespace

Linear stacked_linear(const Linear& a, const Linear& b) {
  Linear s;
  s.format = a.format;
  s.out = a.out + b.out;
  s.in = a.in;
  s.global_scale = a.global_scale;
  s.name = stacked_name(a.name, b.name);
  return s;
}

int64_t scale_rows(const Linear& l) { return l.format == WeightFormat::fp8_block ? (l.out + 127) / 128 : l.out; }

void view_parts(const Linear& stacked, Linear& a, Linear& b) {
  if (stacked.weight.empty()) return;
  a.weight = stacked.weight.rows(0, a.out);
  b.weight = stacked.weight.rows(a.out, a.out + b.out);
  if (stacked.scale.empty()) return;
  a.scale = stacked.scale.rows(0, scale_rows(a));
  b.scale = stacked.scale.rows(scale_rows(a), scale_rows(a) + scale_rows(b));
}

Linear stack_linears(Linear& a, Linear& b, const Take& take) {
  const std::string refusal = stack_refusal(a, b);
  TERN_CHECK(refusal.empty(), "stack_linears: ", refusal);
  Linear s = stacked_linear(a, b);
  const auto stack = [&](const TensorView& x, const TensorView& y) {
    const TensorView v = take(x.dtype(), {x.dim(0) + y.dim(0), x.dim(1)});
    copy_view(x, v.rows(0, x.dim(0)));
    copy_view(y, v.rows(x.dim(0), x.dim(0) + y.dim(0)));
    return v;
  };
  s.weight = stack(a.weight, b.weight);
  if (!a.scale.empty()) s.scale = stack(a.scale, b.scale);
  view_parts(s, a, b);
  return s;
}

}  // namespace tern::model
