// The decode-graph driver's host side (engine/decode_graphs.h): bucket choice and padding, which steps may replay a
// graph, and the eager path (with its reason) where graphs cannot run.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "engine/decode_graphs.h"
#include "fixture.h"

namespace tern::test {
namespace {

using engine::default_decode_buckets;
using engine::pick_decode_bucket;

TEST(DecodeBuckets, Defaults) {
  EXPECT_EQ(default_decode_buckets(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(default_decode_buckets(5), (std::vector<int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(default_decode_buckets(32), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(default_decode_buckets(100), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100}));
  EXPECT_THROW(default_decode_buckets(0), Error);
}

TEST(DecodeBuckets, PadsToTheSmallestBucketNotBelow) {
  const std::vector<int64_t> b = default_decode_buckets(32);
  EXPECT_EQ(pick_decode_bucket(b, 1), 1);
  EXPECT_EQ(pick_decode_bucket(b, 3), 4);
  EXPECT_EQ(pick_decode_bucket(b, 4), 4);
  EXPECT_EQ(pick_decode_bucket(b, 5), 8);
  EXPECT_EQ(pick_decode_bucket(b, 17), 24);
  EXPECT_EQ(pick_decode_bucket(b, 32), 32);
  EXPECT_EQ(pick_decode_bucket(b, 33), -1);
}

TEST(DecodeGraphs, RefusalsAndTheEagerPathOnTheCpu) {
  const Fixture& f = Fixture::get(Fixture::names().front());
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  cache::SequenceState a = m.new_state(32), b = m.new_state(32);
  int p = 0;
  while (p + 1 < f.num_prompts() && f.ids(p).size() < 2) ++p;
  const std::vector<int64_t> prompt = f.ids(p);
  ASSERT_GE(prompt.size(), 2u);
  const model::StepSequence pa{&a, prompt, model::LogitsFor::last}, pb{&b, prompt, model::LogitsFor::last};
  const auto l32 = m.state_layout(32), l16 = m.state_layout(16), other = m.state_layout(32, 128);
  EXPECT_EQ(m.decode_refusal({&pa, 1}, *l32), "prefill in the step");
  const int64_t tok = 5;
  const model::StepSequence none{&a, std::span<const int64_t>(&tok, 1), model::LogitsFor::none};
  EXPECT_EQ(m.decode_refusal({&none, 1}, *l32), "a decode token without logits");
  const model::StepSequence one{&a, std::span<const int64_t>(&tok, 1), model::LogitsFor::last};
  EXPECT_EQ(m.decode_refusal({&one, 1}, *l32), "");
  EXPECT_EQ(m.decode_refusal({&one, 1}, *l16), "a sequence longer than the graphs' bound");
  EXPECT_EQ(m.decode_refusal({&one, 1}, *other), "a state in pages of another geometry");

  engine::DecodeGraphOptions o;
  o.max_tokens = 32;
  engine::DecodeGraphs graphs(m, o);
  graphs.prepare();
  EXPECT_EQ(graphs.disabled_reason(), "the model is on the CPU");
  const Tensor want = m.forward({&pa, 1});
  const Tensor got = graphs.forward({&pb, 1});
  ASSERT_EQ(want.numel(), got.numel());
  EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0);
  EXPECT_EQ(b.position(), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(graphs.stats().graph_steps, 0u);
  EXPECT_EQ(graphs.stats().eager_steps.at("the model is on the CPU"), 1u);
  if (m.has_mtp()) {  // MTP rows run eagerly too, counted apart from the steps, and give mtp_forward's bits
    const int64_t H = m.config().hc_mult, D = m.config().hidden_size;
    const Tensor hidden(DType::f32, {1, H, D});
    const model::Model::MtpStep row{&b, b.position() - 1, hidden, std::span<const int64_t>(&tok, 1),
                                    model::LogitsFor::last, false};
    const model::Model::MtpResult r = graphs.forward_mtp({&row, 1});
    EXPECT_EQ(r.logits.dim(0), 1);
    EXPECT_EQ(graphs.stats().mtp_eager.at("the model is on the CPU"), 1u);
    EXPECT_EQ(graphs.stats().mtp_graph_steps, 0u);
    EXPECT_EQ(graphs.stats().eager_total(), 1u);  // the MTP rows are not steps
  }

  engine::DecodeGraphOptions off;
  off.enabled = false;
  off.max_tokens = 32;
  engine::DecodeGraphs disabled(m, off);
  disabled.prepare();
  EXPECT_EQ(disabled.disabled_reason(), "cuda graphs disabled (--cuda-graphs off)");
}

}  // namespace
}  // namespace tern::test
