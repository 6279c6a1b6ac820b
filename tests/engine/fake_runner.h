// A tiny deterministic model for engine unit tests only. Its state lives in the engine's real pages: the
// hash of the tokens seen so far in the fixed page (where a fresh state must read zero), and one row per
// position holding the hash after that token, in the row pages. Its logits are a fixed function of the
// hash. Every step checks that chunks arrive in order, that the fixed page and the last row written still
// hold what it wrote there, so scheduler or page-table bugs show up as failures.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "engine/model_runner.h"

namespace tern::engine::testing {

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int64_t vocab = 64, int64_t max_context = 4096, int64_t bytes_per_token = 64)
      : vocab_(vocab), max_context_(max_context), bytes_per_token_(bytes_per_token) {}
  std::string name() const override { return "fake"; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t max_context() const override { return max_context_; }
  // One layer: a one-row ring, a 2-float accumulator holding the hash, and a compressed row of
  // bytes_per_token (>= 8) per token (ratio 1).
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t tokens_per_page) const override {
    const std::vector<cache::LayerSpec> layers{{1, bytes_per_token_, 1, 2, 0, 0}};
    return std::make_shared<const cache::StateLayout>(layers, max_context_, tokens_per_page);
  }
  Device state_device() const override { return Device::cpu; }
  int64_t weight_bytes() const override { return 0; }
  std::vector<std::string> kernel_paths() const override { return {"fake: host"}; }
  void forward(const StepBatch& batch, std::span<float> logits) override {
    size_t row = 0;
    ++steps;
    for (const auto& c : batch.chunks) {
      TERN_CHECK(c.state != nullptr, "fake runner: sequence ", c.seq, " has no state");
      cache::SequenceState& st = *c.state;
      TERN_CHECK(st.position() == c.start, "fake runner: chunk starts at ", c.start, ", state has ", st.position());
      TERN_CHECK(c.start + c.count <= st.capacity(), "fake runner: sequence ", c.seq, " beyond its pages");
      uint64_t hash = load(st.compressor_acc(0).data()) ^ kSeed;
      if (c.start == 0) TERN_CHECK(hash == kSeed, "fake runner: sequence ", c.seq, " got a state that is not fresh");
      if (c.start > 0) {
        const auto last = st.row_runs(0, false, c.start - 1, c.start);
        TERN_CHECK(load(last[0].rows.data()) == hash, "fake runner: sequence ", c.seq, "'s row ", c.start - 1,
                   " does not hold what was written there");
      }
      const auto runs = st.row_runs(0, false, c.start, c.start + c.count);
      for (int32_t i = 0; i < c.count; ++i) {
        hash = (hash ^ static_cast<uint64_t>(batch.tokens[c.token_offset + i] + 1)) * 0x100000001b3ULL;
        for (const auto& run : runs)
          if (i >= run.first && i < run.first + run.rows.dim(0))
            store(run.rows.data_as<std::byte>() + (i - run.first) * bytes_per_token_, hash);
        if (i >= c.count - c.num_logits) write_row(hash, logits.subspan(row++ * vocab_, vocab_));
      }
      store(st.compressor_acc(0).data(), hash ^ kSeed);
      st.advance(c.count);
    }
  }
  int steps = 0;

 private:
  static constexpr uint64_t kSeed = 0xcbf29ce484222325ULL;
  static uint64_t load(const void* p) {
    uint64_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(void* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }
  void write_row(uint64_t h, std::span<float> row) const {
    for (int64_t j = 0; j < vocab_; ++j) {
      uint64_t x = h + static_cast<uint64_t>(j) * 0x9e3779b97f4a7c15ULL;
      x ^= x >> 29;
      x *= 0xbf58476d1ce4e5b9ULL;
      x ^= x >> 32;
      row[j] = static_cast<float>(x % 10007) / 1000.0f;
    }
  }
  int64_t vocab_, max_context_, bytes_per_token_;
};

}  // namespace tern::engine::testing
