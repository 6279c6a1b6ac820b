// Per-layer intermediates of the debug prompt against the reference's forward hooks: where a parity
// failure starts, and the discrete decisions (indexer picks) made along the way.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"

namespace tern::test {
namespace {

constexpr float kTolerance = 1e-4f;

class Layers : public ::testing::TestWithParam<std::string> {};

TEST_P(Layers, DebugPromptIntermediates) {
  const Fixture& f = Fixture::get(GetParam());
  const TensorView embedding = f.tensor("debug.embedding");
  ASSERT_FALSE(embedding.empty());
  // the debug prompt is the one whose length matches the debug tensors
  int prompt = -1;
  for (int p = 0; p < f.num_prompts(); ++p)
    if (static_cast<int64_t>(f.ids(p).size()) == embedding.dim(0)) prompt = p;
  ASSERT_GE(prompt, 0);
  model::Model m(f.weights(), model::KvMode::exact, cpu::context());
  std::map<std::string, Tensor> seen;  // "debug.layer1.attn_out" -> copy
  m.set_observer([&](std::string_view name, int layer, const TensorView& t) {
    const std::string key = layer < 0 ? "debug." + std::string(name)
                                      : "debug.layer" + std::to_string(layer) + "." + std::string(name);
    Tensor copy(t.dtype(), t.shape());
    std::copy_n(static_cast<const std::byte*>(t.data()), t.nbytes(), copy.data<std::byte>());
    seen[key] = std::move(copy);
  });
  const std::vector<int64_t> ids = f.ids(prompt);
  cache::SequenceState state = m.new_state(static_cast<int64_t>(ids.size()));
  const model::StepSequence s{&state, ids, model::LogitsFor::all};
  m.forward({&s, 1});
  int compared = 0;
  float worst = 0;
  std::string worst_key;
  for (const auto& [key, got] : seen) {
    const TensorView want = f.tensor(key);
    if (want.empty()) continue;
    ASSERT_EQ(want.numel(), got.numel()) << key;
    ++compared;
    if (got.dtype() == DType::i32) {  // indexer picks, best first, -1 = none
      for (int64_t i = 0; i < got.numel(); ++i)
        EXPECT_EQ(got.data<int32_t>()[i], want.data_as<const int64_t>()[i]) << key << " element " << i;
      continue;
    }
    const Diff d = diff(got.data<float>(), want.data_as<const float>(), got.numel());
    if (d.rel() > worst) worst = d.rel(), worst_key = key;
    EXPECT_LE(d.max_abs, kTolerance * d.ref_max) << key;
  }
  EXPECT_GE(compared, 24);
  std::printf("[%s] %d debug intermediates: max|d|/max|ref| = %.3g (%s)\n", GetParam().c_str(), compared,
              worst, worst_key.c_str());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Layers, ::testing::ValuesIn(Fixture::names()),
                         [](const auto& info) { return info.param == "tiny-mxfp4" ? "mxfp4" : "nvfp4"; });

}  // namespace
}  // namespace tern::test
