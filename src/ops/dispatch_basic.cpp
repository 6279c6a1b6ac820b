// Entry points of the generic ops: check arguments, then call the context's backend.
#include <string_view>

#include "ops/backend.h"
#include "ops/check.h"
#include "ops/context.h"

namespace tern::ops {

using detail::common_device;
using detail::expect_dtype;
using detail::expect_shape;

namespace {

// rms_norm's weight (also norm_rope's): absent, or bf16 / f32 [x's last dim].
void check_norm_weight(std::string_view op, const TensorView& x, const TensorView& weight) {
  if (weight.empty()) return;
  expect_dtype(op, "weight", weight, {DType::bf16, DType::f32});
  expect_shape(op, "weight", weight, {x.dim(-1)});
}

// rope's x (also norm_rope's): [rows, head_dim] or [rows, heads, head_dim].
void check_rope_rank(std::string_view op, const TensorView& x) {
  TERN_CHECK(x.rank() == 2 || x.rank() == 3, op, ": x must be [rows, head_dim] or [rows, heads, head_dim], found ",
             x.shape().str());
}

// rope's positions i64 [rows] and inv_freq f32 [rope_dim / 2] within head_dim (also norm_rope's).
void check_rope_tables(std::string_view op, const TensorView& x, const TensorView& positions,
                       const TensorView& inv_freq) {
  expect_dtype(op, "positions", positions, {DType::i64});
  expect_shape(op, "positions", positions, {x.dim(0)});
  expect_dtype(op, "inv_freq", inv_freq, {DType::f32});
  expect_shape(op, "inv_freq", inv_freq, {-1});
  TERN_CHECK(2 * inv_freq.dim(0) <= x.dim(-1), op, ": rope dim ", 2 * inv_freq.dim(0), " exceeds head_dim ",
             x.dim(-1));
}

}  // namespace

void embedding(const Context& ctx, const TensorView& table, const TensorView& ids, const TensorView& out) {
  expect_dtype("embedding", "table", table, {DType::bf16, DType::f32});
  expect_shape("embedding", "table", table, {-1, -1});
  expect_dtype("embedding", "ids", ids, {DType::i64});
  expect_shape("embedding", "ids", ids, {-1});
  expect_shape("embedding", "out", out, {ids.dim(0), table.dim(1)});
  ctx.backend_for(common_device("embedding", {&table, &ids, &out})).embedding(table, ids, out);
}

void add(const Context& ctx, const TensorView& x, const TensorView& y) {
  TERN_CHECK(x.shape() == y.shape(), "add: shapes differ: ", x.shape().str(), " vs ", y.shape().str());
  detail::expect_contiguous("add", "x", x);
  detail::expect_contiguous("add", "y", y);
  ctx.backend_for(common_device("add", {&x, &y})).add(x, y);
}

void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up, float limit,
            const TensorView& out) {
  TERN_CHECK(gate.shape() == up.shape() && gate.shape() == out.shape(), "swiglu: shapes differ: gate ",
             gate.shape().str(), ", up ", up.shape().str(), ", out ", out.shape().str());
  detail::expect_rows("swiglu", "gate", gate);
  detail::expect_rows("swiglu", "up", up);
  detail::expect_contiguous("swiglu", "out", out);
  ctx.backend_for(common_device("swiglu", {&gate, &up, &out})).swiglu(gate, up, limit, out);
}

void gather_rows(const Context& ctx, const TensorView& x, const TensorView& rows, const TensorView& out) {
  expect_shape("gather_rows", "x", x, {-1, -1});
  expect_dtype("gather_rows", "rows", rows, {DType::i64});
  expect_shape("gather_rows", "rows", rows, {-1});
  expect_shape("gather_rows", "out", out, {rows.dim(0), x.dim(1)});
  ctx.backend_for(common_device("gather_rows", {&x, &rows, &out})).gather_rows(x, rows, out);
}

void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps,
              const TensorView& out) {
  TERN_CHECK(x.rank() >= 1 && x.shape() == out.shape(), "rms_norm: x ", x.shape().str(), " and out ",
             out.shape().str(), " must have one shape");
  detail::expect_rows("rms_norm", "x", x);
  detail::expect_contiguous("rms_norm", "out", out);
  check_norm_weight("rms_norm", x, weight);
  ctx.backend_for(common_device("rms_norm", {&x, &weight, &out})).rms_norm(x, weight, eps, out);
}

void rope(const Context& ctx, const TensorView& x, const TensorView& positions, const TensorView& inv_freq,
          bool inverse) {
  check_rope_rank("rope", x);
  detail::expect_contiguous("rope", "x", x);
  check_rope_tables("rope", x, positions, inv_freq);
  ctx.backend_for(common_device("rope", {&x, &positions, &inv_freq})).rope(x, positions, inv_freq, inverse);
}

void norm_rope(const Context& ctx, const TensorView& x, const TensorView& weight, float eps,
               const TensorView& positions, const TensorView& inv_freq, const TensorView& out) {
  check_rope_rank("norm_rope", x);
  TERN_CHECK(x.shape() == out.shape(), "norm_rope: x ", x.shape().str(), " and out ", out.shape().str(),
             " must have one shape");
  detail::expect_rows("norm_rope", "x", x);
  detail::expect_contiguous("norm_rope", "out", out);
  check_norm_weight("norm_rope", x, weight);
  check_rope_tables("norm_rope", x, positions, inv_freq);
  ctx.backend_for(common_device("norm_rope", {&x, &weight, &positions, &inv_freq, &out}))
      .norm_rope(x, weight, eps, positions, inv_freq, out);
}

void linear(const Context& ctx, const TensorView& x, const Weight& w, const TensorView& y) {
  check_weight(w);
  expect_shape(cat("linear ", w.name), "x", x, {-1, w.in});
  expect_shape(cat("linear ", w.name), "y", y, {x.dim(0), w.out});
  ctx.backend_for(common_device("linear", {&x, &w.weight, &w.scale, &y})).linear(x, w, y);
}

void grouped_linear(const Context& ctx, const TensorView& x, const Weight& w, const TensorView& y) {
  check_weight(w);
  const std::string op = cat("grouped_linear ", w.name);
  detail::expect_rank(op, "x", x, 3);
  const int64_t groups = x.dim(1);
  TERN_CHECK(groups > 0 && w.out % groups == 0, op, ": ", w.out, " output rows do not split into ", groups,
             " groups");
  expect_shape(op, "x", x, {-1, groups, w.in});
  expect_shape(op, "y", y, {x.dim(0), groups, w.out / groups});
  ctx.backend_for(common_device("grouped_linear", {&x, &w.weight, &w.scale, &y})).grouped_linear(x, w, y);
}

void act_quant(const Context& ctx, const TensorView& x, const Fp8Rows& out) {
  const char* op = "act_quant";
  expect_dtype(op, "x", x, {DType::f32});
  detail::expect_rows(op, "x", x, {out.rows, -1});
  detail::expect_fp8_rows(op, "out", out, x.dim(0), x.dim(1));
  ctx.backend_for(common_device(op, {&x, &out.values, &out.scales})).act_quant_rows(x, out);
}

void grouped_linear(const Context& ctx, const Fp8Rows& x, int64_t groups, const Weight& w, const TensorView& y) {
  check_weight(w);
  const std::string op = cat("grouped_linear ", w.name, " (FP8 rows)");
  TERN_CHECK(w.act_fp8 && !w.exact, op, ": rows already quantised go to a product that takes FP8 activations");
  TERN_CHECK(groups > 0 && w.out % groups == 0, op, ": ", w.out, " output rows do not split into ", groups, " groups");
  detail::expect_fp8_rows(op, "x", x, x.rows, groups * w.in);
  expect_shape(op, "y", y, {x.rows, groups, w.out / groups});
  ctx.backend_for(common_device(op, {&x.values, &x.scales, &w.weight, &w.scale, &y})).grouped_linear_fp8(x, groups, w, y);
}

void prefetch(const Context& ctx, const Weight& w) {
  check_weight(w);
  ctx.backend_for(common_device("prefetch", {&w.weight, &w.scale})).prefetch(w);
}

void dequantize(const Context& ctx, const Weight& w, const TensorView& out) {
  check_weight(w);
  expect_dtype("dequantize", "out", out, {DType::f32});
  expect_shape("dequantize", "out", out, {w.out, w.in});
  ctx.backend_for(common_device("dequantize", {&w.weight, &w.scale, &out})).dequantize(w, out);
}

void kv_pack(const Context& ctx, const TensorView& x, const KvRowFormat& f, const TensorView& rows) {
  f.check();
  expect_dtype("kv_pack", "x", x, {DType::f32});
  expect_shape("kv_pack", "x", x, {-1, f.head_dim});
  expect_dtype("kv_pack", "rows", rows, {DType::u8});
  expect_shape("kv_pack", "rows", rows, {x.dim(0), f.row_bytes()});
  ctx.backend_for(common_device("kv_pack", {&x, &rows})).kv_pack(x, f, rows);
}

void kv_unpack(const Context& ctx, const TensorView& rows, const KvRowFormat& f, const TensorView& x) {
  f.check();
  expect_dtype("kv_unpack", "rows", rows, {DType::u8});
  expect_shape("kv_unpack", "rows", rows, {-1, f.row_bytes()});
  expect_dtype("kv_unpack", "x", x, {DType::f32});
  expect_shape("kv_unpack", "x", x, {rows.dim(0), f.head_dim});
  ctx.backend_for(common_device("kv_unpack", {&x, &rows})).kv_unpack(rows, f, x);
}

}  // namespace tern::ops
