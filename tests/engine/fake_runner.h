// A tiny deterministic model for engine unit tests only: each sequence's "state" is a hash of the
// tokens it has seen, position by position, and its logits are a fixed function of that hash. It
// checks that chunks arrive in order and that states are fresh, so scheduler bugs show up as failures.
#pragma once

#include <cstdint>
#include <cstring>
#include <unordered_map>

#include "core/error.h"
#include "engine/model_runner.h"

namespace tern::engine::testing {

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(int64_t vocab = 64, int64_t max_context = 4096, int64_t bytes_per_token = 64)
      : vocab_(vocab), max_context_(max_context), bytes_per_token_(bytes_per_token) {}
  std::string name() const override { return "fake"; }
  int64_t vocab_size() const override { return vocab_; }
  StateLayout state_layout() const override { return {1024, bytes_per_token_, max_context_}; }
  int64_t weight_bytes() const override { return 0; }
  std::vector<std::string> kernel_paths() const override { return {"fake: host"}; }
  void open_sequence(uint64_t seq, int64_t max_tokens) override {
    TERN_CHECK(max_tokens > 0 && max_tokens <= max_context_, "fake runner: bad capacity ", max_tokens);
    TERN_CHECK(!states_.count(seq), "fake runner: sequence ", seq, " opened twice");
    states_[seq] = {};
    states_[seq].capacity = max_tokens;
    ++opened;
  }
  void close_sequence(uint64_t seq) override {
    TERN_CHECK(states_.erase(seq) == 1, "fake runner: closing unknown sequence ", seq);
  }
  void forward(const StepBatch& batch, std::span<float> logits) override {
    size_t row = 0;
    ++steps;
    for (const auto& c : batch.chunks) {
      auto& st = states_.at(c.seq);
      TERN_CHECK(st.length == c.start, "fake runner: chunk starts at ", c.start, ", state has ", st.length);
      TERN_CHECK(c.start + c.count <= st.capacity, "fake runner: sequence ", c.seq, " beyond its capacity");
      for (int32_t i = 0; i < c.count; ++i) {
        st.hash = (st.hash ^ static_cast<uint64_t>(batch.tokens[c.token_offset + i] + 1)) * 0x100000001b3ULL;
        st.length++;
        if (i >= c.count - c.num_logits) write_row(st.hash, logits.subspan(row++ * vocab_, vocab_));
      }
    }
  }
  // The state as bytes: hash, length, capacity.
  std::vector<std::byte> export_state(uint64_t seq) const override {
    const auto& st = states_.at(seq);
    std::vector<std::byte> out(sizeof(State));
    std::memcpy(out.data(), &st, sizeof st);
    return out;
  }
  void import_state(uint64_t seq, std::span<const std::byte> bytes, int64_t position) override {
    auto& st = states_.at(seq);
    TERN_CHECK(bytes.size() == sizeof(State), "fake runner: a state is ", sizeof(State), " bytes, found ", bytes.size());
    State in;
    std::memcpy(&in, bytes.data(), sizeof in);
    TERN_CHECK(in.capacity == st.capacity, "fake runner: capacity ", in.capacity, " != ", st.capacity);
    TERN_CHECK(in.length == position, "fake runner: state at ", in.length, ", expected ", position);
    st = in;
  }
  size_t live() const { return states_.size(); }
  int opened = 0;
  int steps = 0;

 private:
  struct State {
    uint64_t hash = 0xcbf29ce484222325ULL;
    int64_t length = 0;
    int64_t capacity = 0;
  };
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
  std::unordered_map<uint64_t, State> states_;
};

}  // namespace tern::engine::testing
