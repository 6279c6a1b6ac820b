// The explicit execution context (ops/context.h, issue #17 item 5): a model given a context runs every op of
// its forward in it and consults no registry. While the forward runs, the registry's backend for the host
// refuses every op (naming it), so an op call the model still sends through the registry fails the test.
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
  std::string_view name() const override { return "refusing (the registry's)"; }
};

// The registry's host backend refuses every op for the guard's lifetime; then the CPU backend is back.
class RegistryRefuses {
 public:
  RegistryRefuses() { ops::register_backend(Device::cpu, &refusing_); }
  ~RegistryRefuses() { cpu::register_backend(); }
  RegistryRefuses(const RegistryRefuses&) = delete;
  RegistryRefuses& operator=(const RegistryRefuses&) = delete;

 private:
  RefusingBackend refusing_;
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

TEST(ExplicitContext, ForwardRunsInTheModelsContextAlone) {
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    const std::vector<int64_t> ids = f.ids(f.num_prompts() - 1);
    Model plain(f.weights(), model::KvMode::fp8);  // the registry's context
    const std::vector<Tensor> want = run(plain, ids);

    cpu::CpuBackend own;  // not the registered instance
    Model m(f.weights(), model::KvMode::fp8);
    m.set_context(ops::Context(own, Device::cpu));
    std::vector<Tensor> got;
    {
      const RegistryRefuses guard;
      got = run(m, ids);
    }
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].shape(), want[i].shape()) << name << ", logits " << i;
      EXPECT_EQ(std::memcmp(got[i].data<float>(), want[i].data<float>(), got[i].nbytes()), 0)
          << name << ", logits " << i << ": not the registry's bits";
    }

    // The guard bites: the model in the registry's context fails under it, naming an op.
    try {
      const RegistryRefuses guard;
      run(plain, ids);
      ADD_FAILURE() << name << ": the registry's context ran under a refusing registry";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no refusing (the registry's) kernel for op"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ExplicitContext, RefusesAnotherDevicesTensors) {
  cpu::CpuBackend own;
  const ops::Context host(own, Device::cpu);
  const Fixture& f = Fixture::get(Fixture::names().front());
  Model m(f.weights(), model::KvMode::exact);
  // A context for the GPU's device cannot be given to a model on the host (its tensors would be on the host).
  EXPECT_THROW(m.set_context(ops::Context(own, Device::cuda)), Error);
  m.set_context(host);
  EXPECT_FALSE(m.context().is_registry());
  EXPECT_EQ(&m.context().backend_for(Device::cpu), &own);
  EXPECT_THROW(m.context().backend_for(Device::cuda), Error);
}

}  // namespace
}  // namespace tern::test
