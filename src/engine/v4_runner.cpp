#include "engine/v4_runner.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "ops/backend.h"

namespace tern::engine {

V4Runner::V4Runner(std::shared_ptr<model::Model> model, std::string name, int64_t weight_bytes, int64_t max_context)
    : model_(std::move(model)), name_(std::move(name)), weight_bytes_(weight_bytes), max_context_(max_context) {
  TERN_CHECK(max_context_ > 0, "V4 runner: max_context must be positive, found ", max_context_);
}

void V4Runner::enable_decode_graphs(DecodeGraphOptions options) {
  if (options.max_tokens <= 0) options.max_tokens = max_context_;
  graphs_ = std::make_unique<DecodeGraphs>(*model_, std::move(options));
  graphs_->prepare();
  use_graphs_for_speculation();
}

void V4Runner::reserve_step_memory(int64_t tokens) {
  if (model_->device() == Device::cpu || tokens <= 0) return;
  tokens = std::min(tokens, max_context_);
  const auto layout = model_->state_layout(tokens);
  auto pool = std::make_shared<cache::PagePool>(layout, layout->pages_for(tokens), model_->device());
  cache::SequenceState state(pool, tokens);
  std::vector<int64_t> prompt(static_cast<size_t>(tokens));
  const int64_t vocab = model_->config().vocab_size;
  for (int64_t i = 0; i < tokens; ++i) prompt[static_cast<size_t>(i)] = (i * 7919) % vocab;
  const model::StepSequence seq{&state, prompt, model::LogitsFor::last};
  // host logits: returns when the device is done; with speculative decoding the MTP catch-up and its streams too
  if (spec_)
    (void)spec_->forward({&seq, 1});
  else
    (void)eager_step(*model_, {&seq, 1}, /*logits_on_device=*/false);
}

void V4Runner::enable_speculative(int k, int max_sequences, int64_t tokens_per_page) {
  TERN_CHECK(model_->has_mtp(), "--speculative mtp: the model has no MTP layer (its checkpoint has no mtp.0.* tensors)");
  TERN_CHECK(k >= 1 && k <= model::Speculator::kMaxDrafts, "--num-speculative-tokens: ", k, " (1 to ",
             model::Speculator::kMaxDrafts, ": a verify step brings k + 1 tokens a sequence)");
  spec_ = std::make_unique<model::Speculator>(*model_, *model_->state_layout(max_context_, tokens_per_page),
                                              max_sequences);
  spec_k_ = k;
  use_graphs_for_speculation();
}

void V4Runner::use_graphs_for_speculation() {
  if (!spec_ || !graphs_) return;
  spec_->set_trunk_step([this](std::span<const model::StepSequence> batch, bool want_record, bool on_device,
                               model::TrunkRows& out, Tensor& hold) {
    if (on_device) return graphs_->forward_trunk_device(batch, want_record, out, hold);
    hold = graphs_->forward_trunk(batch, want_record, out);
    return hold.view();
  });
  spec_->set_draft_step([this](std::span<const model::Model::MtpStep> rows) { return graphs_->forward_mtp(rows); });
}

std::vector<std::vector<int32_t>> V4Runner::draft(std::span<const DraftRequest> requests, const DraftChooser& choose) {
  TERN_CHECK(spec_ != nullptr, "V4 runner: speculative decoding is not enabled");
  std::vector<model::DraftSequence> seqs;
  for (const DraftRequest& r : requests) {
    TERN_CHECK(r.count >= 1 && r.count <= spec_k_, "V4 runner: sequence ", r.seq, " asks for ", r.count,
               " drafts (1 to ", spec_k_, ")");
    seqs.push_back({r.state, r.last, r.count, r.greedy});
  }
  spec_->draft(seqs, [&](size_t i, int j, std::span<const float> row) -> int64_t { return choose(i, j, row); });
  std::vector<std::vector<int32_t>> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i)
    for (int64_t d : spec_->drafts(i)) out[i].push_back(static_cast<int32_t>(d));
  return out;
}

void V4Runner::settle(std::span<const int32_t> kept) {
  TERN_CHECK(spec_ != nullptr, "V4 runner: speculative decoding is not enabled");
  const std::vector<int64_t> k(kept.begin(), kept.end());
  spec_->settle(k);
}

void V4Runner::speculative_forward(const StepBatch& batch, std::span<float> logits) {
  rest_.clear();
  verify_.clear();
  for (size_t i = 0; i < batch.chunks.size(); ++i) (batch.chunks[i].drafts > 0 ? verify_ : rest_).push_back(steps_[i]);
  const Tensor rest = rest_.empty() ? Tensor() : spec_->forward(rest_);
  const Tensor verify = verify_.empty() ? Tensor() : spec_->verify(verify_);
  const int64_t vocab = model_->config().vocab_size;
  int64_t at = 0, from_rest = 0, from_verify = 0;
  for (const auto& c : batch.chunks) {
    int64_t& from = c.drafts > 0 ? from_verify : from_rest;
    const Tensor& src = c.drafts > 0 ? verify : rest;
    const int64_t n = c.num_logits * vocab;
    TERN_CHECK((at + n) <= static_cast<int64_t>(logits.size()) && (from + n) <= src.view().numel(),
               "V4 runner: the speculative step returned fewer logits than its chunks want");
    std::memcpy(logits.data() + at, src.data<float>() + from, static_cast<size_t>(n) * sizeof(float));
    at += n;
    from += n;
  }
  TERN_CHECK(at == static_cast<int64_t>(logits.size()), "V4 runner: ", at / vocab, " rows of logits for ",
             logits.size() / static_cast<size_t>(vocab), " wanted");
}

StepPaths V4Runner::step_paths() const {
  StepPaths p;
  const model::Model::StepPaths& eager = model_->step_paths();
  p.table_tokens = static_cast<uint64_t>(eager.table_tokens);
  p.per_sequence_tokens = static_cast<uint64_t>(eager.chunk_tokens);
  p.mixed_steps = static_cast<uint64_t>(eager.mixed_steps);
  if (!graphs_) {
    if (steps_without_graphs_ > 0) p.eager_steps["cuda graphs not enabled"] = steps_without_graphs_;
    return p;
  }
  p.graph_steps = graphs_->stats().graph_steps;
  p.eager_steps = graphs_->stats().eager_steps;
  p.mtp_graph_steps = graphs_->stats().mtp_graph_steps;
  p.mtp_eager_steps = graphs_->stats().mtp_eager;
  return p;
}

std::vector<std::string> V4Runner::kernel_paths() const {
  std::vector<std::string> paths = model_->context().backend_for(model_->device()).kernel_paths();
  if (spec_)
    paths.push_back(cat("speculative decoding: MTP, ", spec_k_, " drafts a round, ", spec_->max_sequences(),
                        " sequences; the trunk's decode and verify steps ",
                        graphs_ ? "replay CUDA graphs (with their streams and record), so do the MTP layer's "
                                  "drafting rounds and catch-ups of a few rows a sequence"
                                : "run eagerly, so does the drafting",
                        "; the rollback (one step for every sequence) and a prompt chunk's catch-up run eagerly"));
  paths.push_back(samples_on_device()
                      ? cat("sampling: on the device (ops::sample_rows; only tokens and logprobs come back)",
                            spec_ ? "; verify steps: greedy requests judged from their rows' device choices, a sampled "
                                    "request's rows (and an oracle's with logprobs) copied to the host for its verdict"
                                  : "")
                      : "sampling: on the host (engine Sampler; the logits are copied back each step)");
  return paths;
}

bool V4Runner::samples_on_device() const {
  return device_sampling_ && (model_->device() != Device::cpu || sample_on_cpu_);
}

void V4Runner::prepare_steps(const StepBatch& batch) {
  tokens_.assign(batch.tokens.begin(), batch.tokens.end());
  steps_.clear();
  for (const auto& c : batch.chunks) {
    TERN_CHECK(c.state != nullptr, "V4 runner: sequence ", c.seq, " has no state");
    TERN_CHECK(c.state->position() == c.start, "V4 runner: sequence ", c.seq, " is at position ",
               c.state->position(), ", the step starts at ", c.start);
    TERN_CHECK(c.num_logits == 0 || c.num_logits == 1 || c.num_logits == c.count,
               "V4 runner: logits for ", c.num_logits, " of ", c.count, " tokens are not supported");
    TERN_CHECK(c.drafts == 0 || (spec_ && c.drafts + 1 == c.count && c.num_logits == c.count),
               "V4 runner: sequence ", c.seq, " brings ", c.drafts, " drafts in ", c.count, " tokens (",
               spec_ ? "a verify chunk is [last, drafts] with every row's logits" : "speculative decoding is off", ")");
    const model::LogitsFor want = c.num_logits == 0   ? model::LogitsFor::none
                                  : c.num_logits == 1 ? model::LogitsFor::last
                                                      : model::LogitsFor::all;
    steps_.push_back({c.state, std::span<const int64_t>(tokens_.data() + c.token_offset, c.count), want});
  }
}

void V4Runner::forward(const StepBatch& batch, std::span<float> logits) {
  prepare_steps(batch);
  if (spec_) {
    speculative_forward(batch, logits);
    if (!graphs_) ++steps_without_graphs_;
    return;
  }
  Tensor out;
  if (graphs_) {
    out = graphs_->forward(steps_);
  } else {
    out = eager_step(*model_, steps_, /*logits_on_device=*/false);
    ++steps_without_graphs_;
  }
  const size_t n = static_cast<size_t>(out.view().numel());
  TERN_CHECK(n == logits.size(), "V4 runner: the model returned ", n, " logits, expected ", logits.size());
  std::memcpy(logits.data(), out.view().data(), n * sizeof(float));
}

void V4Runner::forward_sample(const StepBatch& batch, std::span<const SampleRequest> requests,
                              std::span<SampleResult> results, std::span<float> host_logits) {
  TERN_CHECK(samples_on_device(), "V4 runner: device sampling is off or the model is on the host");
  TERN_CHECK(requests.size() == results.size() && static_cast<int64_t>(requests.size()) == batch.num_logits(),
             "V4 runner: ", requests.size(), " sample requests, ", results.size(), " results, ", batch.num_logits(),
             " rows of logits");
  const int64_t vocab = model_->config().vocab_size;
  host_slot_.assign(requests.size(), -1);  // each to_host row's place in host_logits
  int64_t hosts = 0;
  for (size_t r = 0; r < requests.size(); ++r)
    if (requests[r].to_host) host_slot_[r] = hosts++;
  TERN_CHECK(static_cast<int64_t>(host_logits.size()) == hosts * vocab, "V4 runner: ", hosts,
             " rows of logits go to the host, into ", host_logits.size(), " floats");
  prepare_steps(batch);
  if (!spec_) {
    Tensor hold;
    TensorView logits;
    if (graphs_) {
      logits = graphs_->forward_device(steps_, hold);
    } else {
      hold = eager_step(*model_, steps_, /*logits_on_device=*/true);
      logits = hold.view();
      ++steps_without_graphs_;
    }
    rows_.resize(requests.size());
    std::iota(rows_.begin(), rows_.end(), size_t{0});
    sample_logits(logits, rows_, requests, results, host_logits);
    return;
  }
  // Speculative decoding: the plain chunks through Speculator::forward, then the verify chunks through verify; each
  // step's rows are sampled (and copied) before the next step runs (a replayed graph's logits live in the arena
  // the next replay reuses).
  rest_.clear();
  verify_.clear();
  rest_rows_.clear();
  verify_rows_.clear();
  size_t row = 0;
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const bool verify = batch.chunks[i].drafts > 0;
    (verify ? verify_ : rest_).push_back(steps_[i]);
    for (int32_t j = 0; j < batch.chunks[i].num_logits; ++j) (verify ? verify_rows_ : rest_rows_).push_back(row++);
  }
  if (!rest_.empty()) {
    Tensor hold;
    sample_logits(spec_->forward_device(rest_, hold), rest_rows_, requests, results, host_logits);
  }
  if (!verify_.empty()) {
    Tensor hold;
    sample_logits(spec_->verify_device(verify_, hold), verify_rows_, requests, results, host_logits);
  }
  if (!graphs_) ++steps_without_graphs_;
}

void V4Runner::sample_logits(const TensorView& logits, std::span<const size_t> rows,
                             std::span<const SampleRequest> requests, std::span<SampleResult> results,
                             std::span<float> host_logits) {
  const int64_t vocab = model_->config().vocab_size;
  const size_t n = rows.size();
  TERN_CHECK(logits.rank() == 2 && static_cast<size_t>(logits.dim(0)) == n && logits.dim(1) == vocab,
             "V4 runner: the model returned logits of another shape than ", n, " x ", vocab);
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i) {  // the rows the host's verdict reads
    const size_t r = rows[i];
    if (!requests[r].to_host) continue;
    copy_view(logits.rows(static_cast<int64_t>(i), static_cast<int64_t>(i) + 1),
              TensorView(host_logits.data() + host_slot_[r] * vocab, DType::f32, {1, vocab}));
  }
  for (size_t i = 0; i < n; ++i) {
    const SampleRequest& q = requests[rows[i]];
    if (q.to_host) continue;
    TERN_CHECK(q.params != nullptr && q.history != nullptr, "V4 runner: sample request ", rows[i], " is incomplete");
    TERN_CHECK(q.uniforms.size() == static_cast<size_t>(uniforms_per_sample(*q.params)), "V4 runner: sample request ",
               rows[i], " has ", q.uniforms.size(), " uniforms, it takes ", uniforms_per_sample(*q.params));
  }
  if (logits.device() == Device::cpu) {  // set_sampling_in_runner_on_cpu: the host sampler stands in for sample_rows
    for (size_t i = 0; i < n; ++i) {
      const SampleRequest& q = requests[rows[i]];
      if (q.to_host) continue;
      const std::span<const float> row(logits.data_as<const float>() + static_cast<int64_t>(i) * vocab,
                                       static_cast<size_t>(vocab));
      results[rows[i]] = cpu_sampler_.sample_drawn(row, *q.params, *q.history, q.uniforms);
    }
    return;
  }
  seen_.resize(n);
  counts_.resize(n);
  specs_.resize(n);
  sampled_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const SampleRequest& q = requests[rows[i]];
    seen_[i].clear();
    counts_[i].clear();
    if (q.to_host) {  // sampled greedily, not read (sample_rows takes every row of the tensor)
      ops::SampleRowDesc d;
      d.temperature = 0.0f;
      specs_[i] = {d, {}, {}};
      continue;
    }
    const SamplingParams& p = *q.params;
    ops::SampleRowDesc d;
    d.temperature = p.temperature;
    d.top_k = p.top_k;
    d.top_p = p.top_p;
    d.min_p = p.min_p;
    d.presence = p.presence_penalty;
    d.frequency = p.frequency_penalty;
    d.repetition = p.repetition_penalty;
    d.top_logprobs = p.top_logprobs;
    d.uniform = q.uniforms.empty() ? 0.0 : q.uniforms[0];
    if (p.repetition_penalty != 1.0f) {
      const auto& seen = q.history->seen;
      for (size_t t = 0; t < seen.size(); ++t)
        if (seen[t]) seen_[i].push_back(static_cast<int32_t>(t));
    }
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
      counts_[i].assign(q.history->output_counts.begin(), q.history->output_counts.end());
    specs_[i] = {d, seen_[i], counts_[i]};
  }
  ops::sample_rows(model_->context(), logits, specs_, std::span<ops::SampledRow>(sampled_.data(), n));
  for (size_t i = 0; i < n; ++i) {
    if (requests[rows[i]].to_host) continue;
    const ops::SampledRow& o = sampled_[i];
    SampleResult& res = results[rows[i]];
    res.token = o.token;
    res.logprob = o.logprob;
    res.top.clear();
    for (int t = 0; t < o.num_top; ++t) res.top.push_back({o.top_tokens[t], o.top_logprobs[t]});
  }
}

}  // namespace tern::engine
