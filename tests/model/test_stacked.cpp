// Stacked linears (model/stacked.h): the stack's product is its parts' products side by side, bit for bit on the
// CPU (which computes every output element on its own), and a model whose pairs are stacked (one product each,
// consumers reading row-strided column ranges) gives the logits of one that keeps them apart, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "model/stacked.h"
#include "model/v4_batch.h"
#include "ops/linear.h"
#include "ops/synth.h"

namespace tern::test {
namespace {

using model::Linear;
using model::WeightFormat;

// A linear of V4's shapes, in its own host tensors, filled as the synthetic model fills one.
struct OwnedLinear {
  Linear l;
  std::vector<Tensor> keep;
};
OwnedLinear make_linear(const std::string& name, int64_t out, int64_t in, WeightFormat f, uint64_t seed) {
  OwnedLinear o;
  o.l.format = f, o.l.out = out, o.l.in = in, o.l.name = name;
  ops::SynthFillArgs a;
  a.seed = seed;
  a.b = 0.02f;
  a.rows = out, a.cols = in;
  if (f == WeightFormat::fp8_block) {
    o.keep = {Tensor(DType::e4m3, {out, in}), Tensor(DType::e8m0, {(out + 127) / 128, (in + 127) / 128})};
    o.l.weight = o.keep[0].view(), o.l.scale = o.keep[1].view();
    a.kind = ops::SynthKind::fp8_block;
    a.scale = o.l.scale;
  } else {
    o.keep = {Tensor(DType::bf16, {out, in})};
    o.l.weight = o.keep[0].view();
  }
  a.out = o.l.weight;
  ops::synth_fill(cpu::context(), a);
  return o;
}

bool same_floats(const TensorView& got, const TensorView& want) {
  for (int64_t r = 0; r < want.dim(0); ++r)
    if (std::memcmp(got.rows(r, r + 1).data(), want.rows(r, r + 1).data(), want.dim(1) * sizeof(float)) != 0)
      return false;
  return true;
}

// The model's pairs at V-Flash's shapes: wq_a + wkv (FP8), the compressors' wkv + wgate (bf16; the indexer's
// exact), the shared expert's w1 + w3 (FP8).
TEST(StackedLinears, ProductIsThePartsSideBySideAtV4Shapes) {
  const int64_t D = 4096, T = 3;
  struct Pair {
    int64_t a_out, b_out;
    WeightFormat f;
    bool exact;
  };
  Tensor x(DType::f32, {T, D});
  ops::SynthFillArgs xa;
  xa.seed = 99;
  xa.out = x.view();
  ops::synth_fill(cpu::context(), xa);
  uint64_t seed = 1;
  for (const Pair& p : {Pair{1024, 512, WeightFormat::fp8_block, false}, Pair{1024, 1024, WeightFormat::bf16, false},
                        Pair{256, 256, WeightFormat::bf16, true}, Pair{2048, 2048, WeightFormat::fp8_block, false}}) {
    SCOPED_TRACE(cat(p.a_out, " + ", p.b_out, " ", model::weight_format_name(p.f)));
    OwnedLinear a = make_linear("a", p.a_out, D, p.f, seed++), b = make_linear("b", p.b_out, D, p.f, seed++);
    const Linear a0 = a.l, b0 = b.l;  // the tensors of their own
    ASSERT_EQ(model::stack_refusal(a.l, b.l), "");
    std::vector<Tensor> storage;
    const Linear s = model::stack_linears(a.l, b.l, [&](DType t, const Shape& shape) {
      storage.emplace_back(t, shape);
      return storage.back().view();
    });
    EXPECT_EQ(s.out, p.a_out + p.b_out);
    EXPECT_EQ(a.l.weight.data(), s.weight.data());  // the parts now view the stack
    ops::Weight ws = s, wa = a0, wb = b0;
    ws.exact = wa.exact = wb.exact = p.exact;
    Tensor ys(DType::f32, {T, s.out}), ya(DType::f32, {T, p.a_out}), yb(DType::f32, {T, p.b_out});
    ops::linear(cpu::context(), x, ws, ys);
    ops::linear(cpu::context(), x, wa, ya);
    ops::linear(cpu::context(), x, wb, yb);
    EXPECT_TRUE(same_floats(ys.view().cols(0, p.a_out), ya));
    EXPECT_TRUE(same_floats(ys.view().cols(p.a_out, s.out), yb));
  }
}

TEST(StackedLinears, RefusesWhatOneMatrixCannotHold) {
  OwnedLinear a = make_linear("a", 100, 256, WeightFormat::fp8_block, 1),
              b = make_linear("b", 128, 256, WeightFormat::fp8_block, 2),
              c = make_linear("c", 128, 256, WeightFormat::bf16, 3), d = make_linear("d", 128, 384, WeightFormat::bf16, 4);
  EXPECT_NE(model::stack_refusal(a.l, b.l).find("128-row FP8 scale block"), std::string::npos);
  EXPECT_EQ(model::stack_refusal(b.l, a.l), "");  // a partial last block ends the stack as it ended a
  EXPECT_NE(model::stack_refusal(b.l, c.l).find("format"), std::string::npos);
  EXPECT_NE(model::stack_refusal(c.l, d.l).find("inputs"), std::string::npos);
}

// The loader stacks every pair of the fixtures; unstacking them (the parts still view the same bytes) must not
// change a bit of the logits, over a batch of several sequences (so the column ranges really are strided),
// prefill and decode.
TEST(StackedLinears, ModelLogitsEqualUnstackedBitForBit) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    model::ModelWeights apart = f.weights();
    int stacks = 0;
    for (model::LayerWeights& L : apart.layers) {
      std::vector<Linear*> pairs = {&L.attn.wq_a_wkv, &L.ffn.shared.w13};
      if (L.attn.compressor) pairs.push_back(&L.attn.compressor->wkv_wgate);
      if (L.attn.indexer) pairs.push_back(&L.attn.indexer->compressor.wkv_wgate);
      for (Linear* s : pairs) {
        stacks += !s->weight.empty();
        *s = Linear{};
      }
    }
    EXPECT_GE(stacks, 2 * static_cast<int>(apart.layers.size())) << name << ": the loader stacked too few pairs";
    model::Model stacked(f.weights(), model::KvMode::fp8, cpu::context()), unstacked(std::move(apart), model::KvMode::fp8, cpu::context());
    const int B = 3;
    std::vector<cache::SequenceState> ss, us;
    for (int k = 0; k < B; ++k) ss.push_back(stacked.new_state(64)), us.push_back(unstacked.new_state(64));
    std::vector<std::vector<int64_t>> prompts(B);
    for (int k = 0; k < B; ++k)
      for (int i = 0; i < 5 + 4 * k; ++i) prompts[k].push_back((3 + 7 * i + 11 * k) % 100);
    for (int step = 0; step < 12; ++step) {
      std::vector<std::vector<int64_t>> tokens = prompts;
      if (step > 0)
        for (int k = 0; k < B; ++k) tokens[k] = {(5 + 13 * step + 29 * k) % 100};
      std::vector<model::StepSequence> sb, ub;
      for (int k = 0; k < B; ++k) {
        sb.push_back({&ss[k], tokens[k], model::LogitsFor::last});
        ub.push_back({&us[k], tokens[k], model::LogitsFor::last});
      }
      const Tensor want = unstacked.forward(ub), got = stacked.forward(sb);
      ASSERT_EQ(want.numel(), got.numel());
      EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0) << name << " step " << step;
    }
  }
}

}  // namespace
}  // namespace tern::test
