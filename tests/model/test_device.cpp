// The device plumbing of the model (Model::to_device, device activations through core's DeviceMemory,
// device sequence states, ops::copy) without a GPU: a stand-in "device" whose memory is host memory and
// whose backend is the CPU backend. Every tensor of the forward is then labelled Device::cuda, so a host
// tensor left anywhere in the forward fails the ops' device check, and the logits must equal the host
// model's bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "fixture.h"
#include "ops/backend.h"

namespace tern::test {
namespace {

class HostAsDevice final : public DeviceMemory {
 public:
  void* allocate(size_t bytes) override { return std::calloc(1, bytes); }
  void release(void* p) override { std::free(p); }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void fill(void* p, uint8_t byte, size_t bytes) override { std::memset(p, byte, bytes); }
};

class StandInDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    ops::register_backend(Device::cuda, &backend_);
    set_device_memory(Device::cuda, &memory_);
  }
  void TearDown() override {
    ops::register_backend(Device::cuda, nullptr);
    set_device_memory(Device::cuda, nullptr);
  }
  cpu::CpuBackend backend_;
  HostAsDevice memory_;
};

TEST_F(StandInDevice, ForwardEqualsHostBitForBit) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  model::Model host(f.weights(), model::KvMode::fp8);
  std::vector<Tensor> uploads;
  model::Model dev(f.weights(), model::KvMode::fp8);
  dev.to_device(Device::cuda, [&](const TensorView& v) {
    uploads.push_back(Tensor::copy_of(v, Device::cuda));
    return uploads.back().view();
  });
  for (int p : {0, f.num_prompts() - 1}) {
    const std::vector<int64_t> ids = f.ids(p);
    cache::SequenceState hs = host.new_state(static_cast<int64_t>(ids.size()) + 8);
    cache::SequenceState ds = dev.new_state(static_cast<int64_t>(ids.size()) + 8);
    ASSERT_EQ(ds.device(), Device::cuda);
    // Prefill in two chunks, then a few decode steps: the window ring, compressors and indexer keys live in
    // the device state across calls.
    const auto half = static_cast<int64_t>(ids.size()) / 2;
    std::vector<std::vector<int64_t>> chunks = {{ids.begin(), ids.begin() + half},
                                                {ids.begin() + half, ids.end()}};
    for (int64_t t = 0; t < 5; ++t) chunks.push_back({(t * 37 + 11) % dev.config().vocab_size});
    for (const auto& chunk : chunks) {
      if (chunk.empty()) continue;
      const model::StepSequence a{&hs, chunk, model::LogitsFor::all}, b{&ds, chunk, model::LogitsFor::all};
      const Tensor want = host.forward({&a, 1}), got = dev.forward({&b, 1});
      ASSERT_EQ(got.device(), Device::cpu);
      ASSERT_EQ(want.numel(), got.numel());
      EXPECT_EQ(std::memcmp(want.data<float>(), got.data<float>(), want.nbytes()), 0) << "prompt " << p;
    }
    EXPECT_EQ(ds.position(), hs.position());
    EXPECT_THROW(ds.snapshot(), Error);
  }
}

}  // namespace
}  // namespace tern::test
