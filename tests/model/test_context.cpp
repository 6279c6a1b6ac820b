// The explicit execution context (ops/context.h, issue #17 item 5): a model runs every op of its forward in
// the context it is given (there is no process-wide registry to fall back on): another instance of the CPU
// backend gives the same bits, and a backend that refuses every op fails the forward, naming an op.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "model/v4_model.h"
#include "ops/backend.h"
#include "ops/context.h"

namespace tern::test {
namespace {

using model::LogitsFor;
using model::Model;

class RefusingBackend final : public ops::Backend {
 public:
  std::string_view name() const override { return "refusing"; }
};

// A prompt (the chunk path), then three decode tokens (the step tables), with MTP draft rows where the
// fixture has the layer: every logits row, in order.
std::vector<Tensor> run(Model& m, const std::vector<int64_t>& ids) {
  std::vector<Tensor> out;
  cache::SequenceState s = m.new_state(static_cast<int64_t>(ids.size()) + 8);
  const model::StepSequence prompt{&s, ids, LogitsFor::all};
  const LogitsFor all = LogitsFor::all;
  Tensor streams;
  out.push_back(m.forward({&prompt, 1}, {&all, 1}, streams));
  if (m.has_mtp()) {
    std::vector<int64_t> next(ids.begin() + 1, ids.end());
    next.push_back(ids.front());
    const Model::MtpStep step{&s, 0, streams.view(), next, LogitsFor::all};
    out.push_back(m.mtp_forward({&step, 1}).logits);
  }
  for (int64_t t = 0; t < 3; ++t) {
    const std::vector<int64_t> one{ids[static_cast<size_t>(t) % ids.size()]};
    const model::StepSequence decode{&s, one, LogitsFor::last};
    out.push_back(m.forward({&decode, 1}));
  }
  return out;
}

TEST(ExplicitContext, ForwardRunsInTheModelsContext) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    const std::vector<int64_t> ids = f.ids(f.num_prompts() - 1);
    Model plain(f.weights(), model::KvMode::fp8, cpu::context());
    const std::vector<Tensor> want = run(plain, ids);

    cpu::CpuBackend own;  // not cpu::context()'s instance
    Model m(f.weights(), model::KvMode::fp8, ops::Context(own, Device::cpu));
    const std::vector<Tensor> got = run(m, ids);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape()) << name << ", logits " << i;
      EXPECT_EQ(std::memcmp(got[i].data<float>(), want[i].data<float>(), got[i].nbytes()), 0)
          << name << ", logits " << i << ": not cpu::context()'s bits";
    }

    // Every op goes through the context: one whose backend refuses them fails the forward, naming an op.
    RefusingBackend refusing;
    Model refused(f.weights(), model::KvMode::fp8, ops::Context(refusing, Device::cpu));
    try {
      run(refused, ids);
      ADD_FAILURE() << name << ": a forward ran in a context whose backend refuses every op";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no refusing kernel for op"), std::string::npos) << e.what();
    }
  }
}

TEST(ExplicitContext, RefusesAnotherDevicesTensors) {
  cpu::CpuBackend own;
  const ops::Context host(own, Device::cpu);
  const Fixture& f = Fixture::get(Fixture::names().front());
  // A context for the GPU's device cannot be given to a model on the host (its tensors would be on the host),
  // at construction or later.
  EXPECT_THROW(Model(f.weights(), model::KvMode::exact, ops::Context(own, Device::cuda)), Error);
  Model m(f.weights(), model::KvMode::exact, cpu::context());
  EXPECT_THROW(m.set_context(ops::Context(own, Device::cuda)), Error);
  m.set_context(host);
  EXPECT_EQ(&m.context().backend_for(Device::cpu), &own);
  EXPECT_THROW(m.context().backend_for(Device::cuda), Error);
}

}  // namespace
}  // namespace tern::test
