// The device plumbing of the model (Model::to_device, device activations through core's DeviceMemory,
// device sequence states, ops::copy) without a GPU: a stand-in "device" whose memory is host memory and
// whose backend is the CPU backend. Every tensor of the forward is then labelled Device::cuda, so a host
// tensor left anywhere in the forward fails the ops' device check, and the logits must equal the host
// model's bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "engine/decode_graphs.h"
#include "fixture.h"
#include "fixture_checks.h"
#include "ops/backend.h"
#include "ops/context.h"
#include "ops/elementwise.h"
#include "ops/recorded_steps.h"

namespace tern::test {
namespace {

class HostAsDevice final : public DeviceMemory {
 public:
  // Uninitialised tensors get 0xff bytes (NaN for f32), so a forward that reads an activation element it
  // never wrote shows it in the logits.
  void* allocate(size_t bytes, bool zero) override {
    void* p = std::malloc(bytes);
    std::memset(p, zero ? 0 : 0xff, bytes);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  void fill(void* p, uint8_t byte, size_t bytes) override { std::memset(p, byte, bytes); }
  void synchronize() override {}
};

class StandInDevice : public ::testing::Test {
 protected:
  void SetUp() override { set_device_memory(Device::cuda, &memory_); }
  void TearDown() override { set_device_memory(Device::cuda, nullptr); }
  // The stand-in device's context: the CPU backend's kernels on tensors labelled Device::cuda.
  ops::Context context() { return ops::Context(backend_, Device::cuda, &memory_); }
  cpu::CpuBackend backend_;
  HostAsDevice memory_;
};

TEST_F(StandInDevice, ForwardEqualsHostBitForBit) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  model::Model host(f.weights(), model::KvMode::fp8, cpu::context());
  std::vector<Tensor> uploads;
  model::Model dev(f.weights(), model::KvMode::fp8, cpu::context());
  dev.to_device(Device::cuda, [&](const TensorView& v) {
    uploads.push_back(Tensor::copy_of(v, Device::cuda));
    return uploads.back().view();
  });
  dev.set_context(context());
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
    // The device state's pages hold what the host state's hold: serialize, snapshot and page export read
    // them through the device memory.
    EXPECT_EQ(ds.serialize(), hs.serialize());
    EXPECT_EQ(ds.snapshot().fixed, hs.snapshot().fixed);
    cache::SequenceState back = host.new_state(static_cast<int64_t>(ids.size()) + 8);
    back.import_pages(ds.export_pages());  // device pages gathered, one copy to the host
    EXPECT_EQ(back.serialize(), hs.serialize());
    // A prefill-decode transfer's paths: an export kept on the device imported by a device state, and
    // host bytes imported by a device state (one copy up, then page copies on the device).
    Tensor on_device(DType::u8, {static_cast<int64_t>(ds.export_bytes())}, Device::cuda);
    ds.export_to(on_device.view());
    for (bool from_host : {false, true}) {
      cache::SequenceState moved = dev.new_state(static_cast<int64_t>(ids.size()) + 8);
      if (from_host)
        moved.import_pages(hs.export_pages());
      else
        moved.import_from(on_device.view());
      EXPECT_EQ(moved.serialize(), hs.serialize()) << "from host " << from_host;
    }
  }
}

// Recorded steps on the stand-in device (issue #17 item 5b), with step graphs that record nothing: their capture
// runs the body once. They behave as the CUDA backend's do where it matters here: they are reached through the
// model's context (ops::Context::step_graphs), their memory (the context's, and the backend's for its own
// transients) hands out the step's blocks while a scope is open, and the device's registered memory refuses to
// allocate while a step is being recorded (CudaBackend::memory), so a tensor made outside the explicit path fails
// the capture loudly.
class FakeStepGraphs final : public ops::StepGraphs {
 public:
  // The step memory: host memory, counted (and measured) as the step's while a scope is open; inside a recording
  // scope only inside capture() and within the reserved size, as CudaStepGraphs::allocate.
  class Memory final : public DeviceMemory {
   public:
    explicit Memory(FakeStepGraphs& graphs) : g_(graphs) {}
    void* allocate(size_t bytes, bool zero) override {
      if (g_.open_) {
        TERN_CHECK(g_.measure_ || g_.capturing_, "fake step graphs: an arena block outside a capture");
        ++(g_.measure_ ? g_.planned : g_.arena_blocks);
      }
      void* p = host_.allocate(bytes, zero);
      if (g_.open_) {
        g_.live_[p] = bytes;
        g_.live_bytes_ += bytes;
        g_.peak_ = std::max(g_.peak_, g_.live_bytes_);
        TERN_CHECK(g_.measure_ || g_.peak_ <= g_.reserved_, "fake step graphs: the arena is too small");
      }
      return p;
    }
    void release(void* p) override {
      if (const auto it = g_.live_.find(p); it != g_.live_.end()) {
        g_.live_bytes_ -= it->second;
        g_.live_.erase(it);
      }
      host_.release(p);
    }
    void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
      host_.copy(dst, dd, src, sd, bytes);
    }
    void fill(void* p, uint8_t byte, size_t bytes) override { host_.fill(p, byte, bytes); }
    void synchronize() override {}

   private:
    FakeStepGraphs& g_;
    HostAsDevice host_;
  };

  void arena_begin(bool measure) override {
    TERN_CHECK(!open_, "fake step graphs: a scope is already open");
    open_ = true, measure_ = measure;
    live_.clear();
    live_bytes_ = peak_ = 0;
  }
  size_t arena_end() override {
    open_ = false;
    live_.clear();
    return peak_;
  }
  void arena_reserve(size_t bytes) override {
    reserved_ = bytes;
    ++generation_;
  }
  size_t arena_bytes() const override { return reserved_; }
  int capture(const std::function<void()>& body) override {
    capturing_ = true;
    try {
      body();
    } catch (...) {
      capturing_ = false;
      throw;
    }
    capturing_ = false;
    return captures++;
  }
  void replay(int) override {}
  void drop_all() override {}
  size_t graph_bytes() const override { return 0; }
  uint64_t generation() const override { return generation_; }
  void* pinned_host(size_t bytes) override {
    if (pinned_.size() < bytes) pinned_.resize(bytes);
    return pinned_.data();
  }
  bool capturing() const { return capturing_; }

  int captures = 0;
  int64_t planned = 0, arena_blocks = 0;  // allocations in measuring / recording scopes

 private:
  bool open_ = false, measure_ = false, capturing_ = false;
  std::unordered_map<void*, size_t> live_;
  size_t live_bytes_ = 0, peak_ = 0, reserved_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::byte> pinned_;
};

// The stand-in device's registered memory (core/tensor.h) beside FakeStepGraphs: refuses to allocate while a
// step is being recorded, as the CUDA backend's pool does.
class RefusingWhileRecording final : public DeviceMemory {
 public:
  explicit RefusingWhileRecording(const FakeStepGraphs& graphs) : graphs_(graphs) {}
  void* allocate(size_t bytes, bool zero) override {
    if (graphs_.capturing()) {
      ++refused;
      fail("stand-in device: a tensor of ", bytes, " bytes from the device's memory while a step is being recorded");
    }
    return host_.allocate(bytes, zero);
  }
  void release(void* p) override { host_.release(p); }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    host_.copy(dst, dd, src, sd, bytes);
  }
  void fill(void* p, uint8_t byte, size_t bytes) override { host_.fill(p, byte, bytes); }
  void synchronize() override {}
  int refused = 0;

 private:
  const FakeStepGraphs& graphs_;
  HostAsDevice host_;
};

TEST(StandInSteps, RecordedThroughTheContextsMemory) {
  const Fixture& f = Fixture::get("tiny-mxfp4");
  FakeStepGraphs graphs;
  RefusingWhileRecording registered(graphs);
  FakeStepGraphs::Memory step(graphs);
  set_device_memory(Device::cuda, &registered);
  {
    cpu::CpuBackend backend(&step);  // its step ops' own device tensors: from the step memory
    std::vector<Tensor> uploads;
    model::Model dev(f.weights(), model::KvMode::fp8, cpu::context());
    dev.to_device(Device::cuda, [&](const TensorView& v) {
      uploads.push_back(Tensor::copy_of(v, Device::cuda));
      return uploads.back().view();
    });
    engine::DecodeGraphOptions o;
    // One bucket: the fake capture runs the body on the tables the last dry run uploaded, which fit that bucket
    // alone (a real capture only records, reading nothing).
    o.buckets = {2};
    o.max_tokens = 64;

    // A context without step graphs: the device model's steps run eagerly (no graphs found by device).
    dev.set_context(ops::Context(backend, Device::cuda, &step));
    engine::DecodeGraphs none(dev, o);
    none.prepare();
    EXPECT_EQ(none.disabled_reason(), "the device backend cannot record steps");
    EXPECT_EQ(graphs.planned + graphs.arena_blocks, 0);

    // With them: measured, reserved and recorded through the context's graphs, every tensor of a recorded step
    // from the step memory (the registered memory refused none).
    dev.set_context(ops::Context(backend, Device::cuda, &step, &graphs));
    EXPECT_EQ(dev.context().step_graphs(), &graphs);
    engine::DecodeGraphs recorded(dev, o);
    recorded.prepare();
    EXPECT_EQ(recorded.disabled_reason(), "");
    EXPECT_EQ(graphs.captures, 1);
    EXPECT_EQ(recorded.stats().captures, 1u);
    EXPECT_GT(graphs.planned, 0);
    EXPECT_GT(graphs.arena_blocks, 0);
    EXPECT_GT(graphs.arena_bytes(), 0u);
    EXPECT_EQ(recorded.stats().arena_bytes, graphs.arena_bytes());
    EXPECT_EQ(registered.refused, 0);

    // A backend whose own device tensors come from the registered memory (no stand-in memory given): inside a
    // recording its first one is refused, and the capture fails loudly: every step eager, the reason said.
    cpu::CpuBackend hidden;
    dev.set_context(ops::Context(hidden, Device::cuda, &step, &graphs));
    engine::DecodeGraphs failing(dev, o);
    failing.prepare();
    EXPECT_NE(failing.disabled_reason().find("capture failed"), std::string::npos) << failing.disabled_reason();
    EXPECT_NE(failing.disabled_reason().find("while a step is being recorded"), std::string::npos)
        << failing.disabled_reason();
    EXPECT_GT(registered.refused, 0);
  }
  set_device_memory(Device::cuda, nullptr);
}

// The CPU backend with the CUDA backend's one rounding: x of every linear, grouped linear and expert product
// rounded to bf16 (exact weights keep f32 x). Run as the stand-in device, it tells how far bf16 activations
// alone move the fixture logits (the GPU model test's figures are compared with these, results.md).
class Bf16XBackend final : public ops::Backend {
 public:
  std::string_view name() const override { return "cpu-bf16x"; }
  static void round_in_place(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
  }
  static Tensor rounded(const TensorView& x) {
    Tensor r(DType::f32, x.shape());
    std::copy_n(x.data_as<const float>(), x.numel(), r.data<float>());
    round_in_place(r.data<float>(), r.numel());
    Tensor dev(DType::f32, x.shape(), x.device());
    ops::copy(r, dev);
    return dev;
  }
  void linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override {
    if (w.exact) return c.linear(x, w, y);
    c.linear(rounded(x), w, y);
  }
  void grouped_linear(const TensorView& x, const ops::Weight& w, const TensorView& y) override {
    c.grouped_linear(rounded(x), w, y);
  }
  // The CUDA moe_expert_kernel (moe_impl.cuh) rounds the input of both products: x before w1 / w3, and the
  // SwiGLU output h (kept in f32 between its two kernels) before w2, read through the same bf16 path as x.
  // So: per expert (increasing id, like the CPU backend), rows gathered, w1 / w3, SwiGLU, h rounded, w2.
  void moe_experts(const ops::MoeExpertsArgs& a) override {
    const int64_t T = a.x.dim(0), D = a.x.dim(1), k = a.indices.dim(1);
    const Tensor x = rounded(a.x);
    const auto* idx = a.indices.data_as<const int32_t>();
    const auto* wts = a.weights.data_as<const float>();
    float* out = a.out.data_as<float>();
    std::fill(out, out + T * D, 0.0f);
    for (size_t e = 0; e < a.experts.size(); ++e) {
      std::vector<int64_t> slots;  // t * k + j of the (token, pick) pairs routed to e
      for (int64_t j = 0; j < T * k; ++j)
        if (idx[j] == static_cast<int32_t>(e)) slots.push_back(j);
      if (slots.empty()) continue;
      const ops::Expert& ex = a.experts[e];
      const auto n = static_cast<int64_t>(slots.size());
      const int64_t inter = ex.w1.out;
      Tensor xs(DType::f32, {n, D}), gate(DType::f32, {n, inter}), up(DType::f32, {n, inter}),
          h(DType::f32, {n, inter}), y(DType::f32, {n, D});
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(x.data<float>() + (slots[r] / k) * D, D, xs.data<float>() + r * D);
      c.linear(xs, ex.w1, gate);
      c.linear(xs, ex.w3, up);
      c.swiglu(gate, up, a.limit, h);
      round_in_place(h.data<float>(), h.numel());
      c.linear(h, ex.w2, y);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t d = 0; d < D; ++d) out[(slots[r] / k) * D + d] += y.data<float>()[r * D + d] * wts[slots[r]];
    }
    if (!a.shared.empty()) c.add(a.shared, a.out);  // the shared output after the routed sum (MoeExpertsArgs::shared)
  }
  void embedding(const TensorView& t, const TensorView& i, const TensorView& o) override {
    c.embedding(t, i, o);
  }
  void add(const TensorView& x, const TensorView& y) override { c.add(x, y); }
  void swiglu(const TensorView& g, const TensorView& u, float l, const TensorView& o) override {
    c.swiglu(g, u, l, o);
  }
  void gather_rows(const TensorView& x, const TensorView& r, const TensorView& o) override {
    c.gather_rows(x, r, o);
  }
  void rms_norm(const TensorView& x, const TensorView& w, float e, const TensorView& o) override {
    c.rms_norm(x, w, e, o);
  }
  void rope(const TensorView& x, const TensorView& p, const TensorView& f, bool inv) override {
    c.rope(x, p, f, inv);
  }
  void dequantize(const ops::Weight& w, const TensorView& o) override { c.dequantize(w, o); }
  void hc_pre(const ops::HcPreArgs& a) override { c.hc_pre(a); }
  void hc_comb(const ops::HcCombArgs& a) override { c.hc_comb(a); }
  void hc_post(const TensorView& s, const TensorView& a, const TensorView& p, const TensorView& cm,
               const TensorView& o) override {
    c.hc_post(s, a, p, cm, o);
  }
  void hc_head(const ops::HcHeadArgs& a) override { c.hc_head(a); }
  void hc_expand(const TensorView& x, const TensorView& s) override { c.hc_expand(x, s); }
  void kv_pack(const TensorView& x, const ops::KvRowFormat& f, const TensorView& r) override {
    c.kv_pack(x, f, r);
  }
  void kv_unpack(const TensorView& r, const ops::KvRowFormat& f, const TensorView& x) override {
    c.kv_unpack(r, f, x);
  }
  int64_t compressor_update(const ops::CompressorArgs& a) override { return c.compressor_update(a); }
  void indexer_scores(const ops::IndexerArgs& a, const TensorView& s) override { c.indexer_scores(a, s); }
  void indexer_topk(const ops::IndexerArgs& a, int k, const TensorView& i) override {
    c.indexer_topk(a, k, i);
  }
  void sparse_attention(const ops::AttentionArgs& a, const TensorView& o) override {
    c.sparse_attention(a, o);
  }
  void route_scored(const TensorView& l, const TensorView& b, float s, const TensorView& i,
                    const TensorView& w) override {
    c.route_scored(l, b, s, i, w);
  }
  void route_hash(const TensorView& l, const TensorView& t, const TensorView& ids, float s,
                  const TensorView& i, const TensorView& w) override {
    c.route_hash(l, t, ids, s, i, w);
  }
  // The step ops (forward() runs decode steps and short chunks on the step tables).
  void step_attention(const ops::StepAttentionArgs& a, const TensorView& o) override { c.step_attention(a, o); }
  void step_compressor(const ops::StepCompressorArgs& a) override { c.step_compressor(a); }
  void step_compress_emit(const ops::StepCompressEmitArgs& a) override { c.step_compress_emit(a); }
  void step_indexer_topk(const ops::StepIndexerArgs& a, int k, const TensorView& i) override {
    c.step_indexer_topk(a, k, i);
  }
  void store_ring_rows(const TensorView& r, const TensorView& t, const TensorView& p, const TensorView& f,
                       int64_t w) override {
    c.store_ring_rows(r, t, p, f, w);
  }
  void store_paged_rows(const TensorView& r, const ops::StepPagedRows& d, const TensorView& p, int ratio) override {
    c.store_paged_rows(r, d, p, ratio);
  }

 private:
  cpu::CpuBackend c;
};

// The CPU with the CUDA backend's bf16 rounding points, judged like the GPU (fixture_checks.h) on the
// fixtures' bf16 set: teacher-forced logits and greedy continuations with their step logits. The main set is
// reported (its long prompts part under bf16 activations in the reference itself). One more sample of the
// bf16 rounding noise besides the GPU and the reference's bf16-x runs: same rounding points, other sums.
TEST(Bf16Activations, FixtureLogits) {
  Bf16XBackend backend;
  HostAsDevice memory;
  // The backend in the model's explicit context (ops/context.h); the stand-in device's memory is still the
  // registered one (states, uploads).
  set_device_memory(Device::cuda, &memory);
  for (const std::string& name : Fixture::names()) {
    const Fixture& f = Fixture::get(name);
    std::vector<Tensor> uploads;
    model::Model m(f.weights(), model::KvMode::exact, cpu::context());
    m.to_device(Device::cuda, [&](const TensorView& v) {
      uploads.push_back(Tensor::copy_of(v, Device::cuda));
      return uploads.back().view();
    });
    m.set_context(ops::Context(backend, Device::cuda, &memory));
    ASSERT_GT(f.num_prompts(kBf16Set), 0) << name << ": no bf16 set (regenerate the fixtures)";
    print_bf16_set_gaps(f, "cpu bf16-x");
    check_teacher_forced(m, Device::cuda, f, kBf16Set, true, "cpu bf16-x");
    check_greedy(m, Device::cuda, f, kBf16Set, true, "cpu bf16-x");
    if (!sanitized_build()) check_teacher_forced(m, Device::cuda, f, "prompt", false, "cpu bf16-x");
  }
  set_device_memory(Device::cuda, nullptr);
}

}  // namespace
}  // namespace tern::test
