#include "engine/engine.h"

#include <algorithm>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine_sequence.h"

namespace tern::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
    case FinishReason::handover: return "handover";
  }
  return "?";
}

const char* request_state_name(RequestState s) {
  switch (s) {
    case RequestState::waiting: return "waiting";
    case RequestState::transferring: return "transferring";
    case RequestState::prefilling: return "prefilling";
    case RequestState::decoding: return "decoding";
    case RequestState::finished: return "finished";
    case RequestState::aborted: return "aborted";
  }
  return "?";
}

Engine::Engine(std::shared_ptr<ModelRunner> runner, EngineOptions options)
    : runner_(std::move(runner)),
      options_(std::move(options)),
      pool_(runner_->state_layout(options_.tokens_per_page), options_.state_memory_bytes, runner_->state_device()) {
  TERN_CHECK(options_.token_bytes, "engine: token_bytes is required");
  vocab_ = runner_->vocab_size();
  max_context_ = runner_->max_context();
  auto& l = options_.limits;
  l.token_budget = std::max<int64_t>(l.token_budget, l.max_running);  // every running sequence can decode
  speculative_tokens_ = runner_->speculative_tokens();
  if (speculative_tokens_ > 0) {
    TERN_CHECK(runner_->speculative_sequences() >= l.max_running, "engine: the runner reserved speculative rollback "
               "memory for ", runner_->speculative_sequences(), " sequences; up to ", l.max_running, " may run");
    metrics_.speculative_tokens = speculative_tokens_;
    metrics_.spec_accepted_per_position.assign(static_cast<size_t>(speculative_tokens_), 0);
  }
  TERN_CHECK(options_.oracle_accept <= 1 && (options_.oracle_accept < 0 || speculative_tokens_ > 0),
             "engine: the oracle acceptance (", options_.oracle_accept, ") needs speculative decoding and at most 1");
  publish_gauges();
}

Engine::~Engine() { stop(); }

std::string Engine::memory_plan() const {
  const PageGeometry g = pool_.geometry();
  const int64_t per_seq_4k = g.pages_for(4096);
  const int64_t logits = options_.limits.max_running * vocab_ * 4;
  return cat("weights ", runner_->weight_bytes() >> 20, " MiB; state pool ", pool_.total_bytes() >> 20, " MiB = ",
             pool_.total_pages(), " pages of ", g.page_bytes, " B in ",
             runner_->state_device() == Device::cpu ? "host" : "device", " memory",
             " (a sequence holds ", g.fixed_pages, " fixed pages + 1 page per ", g.tokens_per_page, " tokens; ",
             pool_.total_pages() / per_seq_4k, " sequences of 4096 tokens); logits workspace up to ", logits >> 20,
             " MiB (", options_.limits.max_running, " rows); step budget ", options_.limits.token_budget,
             " tokens, ", options_.limits.max_running, " sequences", speculative_plan());
}

int64_t Engine::state_capacity_tokens() const {
  const PageGeometry g = pool_.geometry();
  return std::max<int64_t>(0, pool_.total_pages() - g.fixed_pages) * g.tokens_per_page;
}

std::unique_ptr<Engine::Sequence> Engine::make_sequence(GenerationRequest request, UpdateSink sink) {
  const auto& p = request.prompt;
  TERN_CHECK(!p.empty(), "the prompt is empty");
  for (int32_t t : p) TERN_CHECK(t >= 0 && t < vocab_, "token id ", t, " is outside the vocabulary [0, ", vocab_, ")");
  const auto n = static_cast<int64_t>(p.size());
  TERN_CHECK(n < max_context_, "the prompt has ", n, " tokens; the model's context is ", max_context_, " tokens");
  TERN_CHECK(pool_.geometry().pages_for(n + 1) <= pool_.total_pages(), "the prompt has ", n,
             " tokens; the state memory holds at most ", pool_.total_bytes(), " bytes for one sequence");
  TERN_CHECK(request.stop.max_tokens >= 1, "max_tokens must be at least 1");
  auto seq = std::make_unique<Sequence>();
  seq->tokens = p;
  seq->prompt_len = n;
  seq->rng.seed(request.sampling.seed ? *request.sampling.seed : std::random_device{}());
  if (request.sampling.repetition_penalty != 1.0f) seq->history.add_prompt(p, vocab_);
  seq->text = TextStream(request.stop.stop);
  seq->request = std::move(request);
  seq->sink = std::move(sink);
  seq->arrival = Clock::now();
  return seq;
}

uint64_t Engine::enqueue(std::unique_ptr<Sequence> seq) {
  std::lock_guard lock(inbox_mutex_);
  TERN_CHECK(!stopping_, "the server is shutting down");
  seq->id = next_id_++;
  const uint64_t id = seq->id;
  inbox_.push_back(std::move(seq));
  ++live_;
  ++events_;
  inbox_cv_.notify_one();
  return id;
}

uint64_t Engine::submit(GenerationRequest request, UpdateSink sink) {
  return enqueue(make_sequence(std::move(request), std::move(sink)));
}

void Engine::abort(uint64_t id) {
  std::lock_guard lock(inbox_mutex_);
  aborts_.push_back(id);
  ++events_;
  inbox_cv_.notify_one();
}

void Engine::abort_all() {
  std::lock_guard lock(inbox_mutex_);
  abort_everything_ = true;
  ++events_;
  inbox_cv_.notify_one();
}

void Engine::fail(uint64_t id, std::string message) {
  std::lock_guard lock(inbox_mutex_);
  failures_.emplace_back(id, std::move(message));
  ++events_;
  inbox_cv_.notify_one();
}

bool Engine::idle() const {
  std::lock_guard lock(inbox_mutex_);
  return live_ == 0;
}

void Engine::start() {
  TERN_CHECK(!thread_.joinable(), "engine: already started");
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
    abort_everything_ = true;
    ++events_;
    inbox_cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

// Steps while there is work; sleeps until the inbox changes when there is none (e.g. only remote
// requests waiting for their state).
void Engine::loop() {
  bool busy = false;
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(inbox_mutex_);
      inbox_cv_.wait(lock, [&] { return stopping_ || (live_ > 0 && (busy || events_ != seen)); });
      if (stopping_ && live_ == 0) break;
      seen = events_;
    }
    try {
      busy = step();
    } catch (const std::exception& e) {
      // A failed step is a bug or a broken backend: fail every request in it, keep serving.
      log::error("engine step failed: ", e.what());
      for (auto id : std::vector<uint64_t>(running_)) {
        RequestUpdate u;
        u.error = e.what();
        finish(*seqs_.at(id), FinishReason::error, std::move(u));
      }
      busy = true;
    }
  }
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Sequence>> fresh;
  std::vector<uint64_t> aborts;
  std::vector<std::pair<uint64_t, std::string>> failures;
  std::vector<Provided> provided;
  bool everything = false;
  {
    std::lock_guard lock(inbox_mutex_);
    fresh.swap(inbox_);
    aborts.swap(aborts_);
    failures.swap(failures_);
    provided.swap(provided_);
    everything = abort_everything_;
    abort_everything_ = false;
  }
  for (auto& s : fresh) {
    (s->remote ? remote_ : waiting_).push_back(s->id);
    seqs_.emplace(s->id, std::move(s));
  }
  if (everything) {
    aborts.clear();
    for (const auto& [id, s] : seqs_) aborts.push_back(id);
  }
  for (auto& [id, message] : failures) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    RequestUpdate u;
    u.error = std::move(message);
    finish(*it->second, FinishReason::error, std::move(u));
  }
  for (uint64_t id : aborts) {
    auto it = seqs_.find(id);
    if (it != seqs_.end()) finish(*it->second, FinishReason::abort, {});
  }
  for (const auto& p : provided) import_state(p);
}

std::vector<SchedSeq> Engine::sched_view(const std::vector<uint64_t>& ids, bool speculate) const {
  std::vector<SchedSeq> out;
  out.reserve(ids.size());
  for (uint64_t id : ids) {
    const Sequence& s = *seqs_.at(id);
    out.push_back({id, static_cast<int64_t>(s.tokens.size()), s.num_computed, pool_.pages_held(id), s.request.client,
                   lookahead(s, speculate)});
  }
  return out;
}

bool Engine::step() {
  const auto t0 = Clock::now();
  drain_inbox();
  reserve_remote();
  const auto running = sched_view(running_, speculate_now());
  const auto waiting = sched_view(std::vector<uint64_t>(waiting_.begin(), waiting_.end()), false);
  SchedulerInput in{running, waiting, pool_.free_pages(), pool_.geometry(), options_.limits};
  in.limits.admission_reserve_pages = static_cast<int64_t>(running_.size()) / 8;
  const BatchPlan plan = schedule(in);
  apply_plan(plan);
  if (!plan.chunks.empty()) run_batch(plan);
  publish_gauges();
  if (plan.chunks.empty()) return !plan.empty();
  StepPaths paths = runner_->step_paths();  // on the engine thread, like the runner's steps
  std::lock_guard lock(metrics_mutex_);
  ++metrics_.steps_total;
  metrics_.step_paths = std::move(paths);
  metrics_.batch_size.observe(static_cast<double>(plan.chunks.size()));
  metrics_.step_seconds.observe(std::chrono::duration<double>(Clock::now() - t0).count());
  return true;
}

void Engine::apply_plan(const BatchPlan& plan) {
  for (uint64_t id : plan.out_of_memory) {
    log::warn("request ", id, " cannot grow within the state memory: finished with length");
    finish(*seqs_.at(id), FinishReason::length, {});
  }
  for (uint64_t id : plan.preempted) {
    Sequence& s = *seqs_.at(id);
    free_state(s);
    s.num_computed = 0;
    s.state = RequestState::waiting;
    std::erase(running_, id);
    waiting_.push_front(id);
  }
  if (!plan.preempted.empty()) {
    std::lock_guard lock(metrics_mutex_);
    metrics_.preemptions_total += plan.preempted.size();
  }
  for (uint64_t id : plan.admitted) {
    // Admission is fair across clients, so not always the front of the queue.
    TERN_CHECK(std::erase(waiting_, id) == 1, "scheduler admitted request ", id, ", which is not waiting");
    Sequence& s = *seqs_.at(id);
    s.state = RequestState::prefilling;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), id), id);
  }
}

void Engine::run_batch(const BatchPlan& plan) {
  batch_.clear();
  for (const auto& c : plan.chunks)
    TERN_CHECK(pool_.reserve(c.id, c.start + c.count + c.drafts), "state pool: the plan does not fit (scheduler bug)");
  if (speculative_tokens_ > 0) draft(plan);
  for (const auto& c : plan.chunks) {
    Sequence& s = *seqs_.at(c.id);
    const auto drafts = static_cast<int32_t>(c.drafts);
    batch_.chunks.push_back({c.id, &pool_.state(c.id), c.start, static_cast<int32_t>(c.count + c.drafts),
                             c.sample ? 1 + drafts : 0, static_cast<int64_t>(batch_.tokens.size()), drafts});
    batch_.tokens.insert(batch_.tokens.end(), s.tokens.begin() + c.start, s.tokens.begin() + c.start + c.count);
    if (drafts > 0) batch_.tokens.insert(batch_.tokens.end(), drafts_.at(c.id).begin(), drafts_.at(c.id).end());
  }
  const auto rows = static_cast<size_t>(batch_.num_logits());
  struct Sampled {
    Sequence* seq;
    const PlannedChunk* chunk;
    size_t row;  // its first row of logits
  };
  std::vector<Sampled> sampled;
  size_t row = 0;
  for (const auto& c : plan.chunks)
    if (c.sample) {
      sampled.push_back({seqs_.at(c.id).get(), &c, row});
      row += static_cast<size_t>(1 + c.drafts);
    }
  emitted_.resize(sampled.size());
  const bool on_device = runner_->samples_on_device();
  std::vector<size_t> host_row(sampled.size(), 0);  // device sampling: a host-verdict chunk's first row there
  const auto t0 = Clock::now();
  if (on_device) {
    // The runner samples where the logits are; the uniforms come from each request's generator here,
    // as the host sampler would draw them (same count, same order). A verify chunk's rows are sampled there too
    // when its verdict needs only the target's own choices, else they come to the host for verdict().
    results_.assign(rows, {});
    uniforms_.resize(rows * kMaxUniformsPerSample);
    sample_requests_.assign(rows, {});
    verify_histories_.clear();
    size_t host_rows = 0;
    for (size_t i = 0; i < sampled.size(); ++i) {
      Sequence& s = *sampled[i].seq;
      const PlannedChunk& c = *sampled[i].chunk;
      const size_t r = sampled[i].row, n = 1 + static_cast<size_t>(c.drafts);
      if (c.drafts > 0 && verdict_on_device(s)) {
        verify_requests(s, c, std::span<SampleRequest>(sample_requests_).subspan(r, n));
      } else if (c.drafts > 0) {
        for (size_t j = 0; j < n; ++j) sample_requests_[r + j].to_host = true;
        host_row[i] = host_rows;
        host_rows += n;
      } else {
        std::span<double> u(uniforms_.data() + r * kMaxUniformsPerSample, kMaxUniformsPerSample);
        const int drawn = draw_uniforms(s.request.sampling, s.rng, u);
        sample_requests_[r] = {&s.request.sampling, &s.history, u.first(static_cast<size_t>(drawn))};
      }
    }
    if (logits_.size() < host_rows * vocab_) logits_.resize(host_rows * vocab_);
    runner_->forward_sample(batch_, sample_requests_, results_, std::span<float>(logits_.data(), host_rows * vocab_));
  } else {
    if (logits_.size() < rows * vocab_) logits_.resize(rows * vocab_);
    runner_->forward(batch_, std::span<float>(logits_.data(), rows * vocab_));
  }
  const auto t1 = Clock::now();
  for (const auto& c : plan.chunks)
    if (c.drafts == 0) seqs_.at(c.id)->num_computed += c.count;  // a verify chunk's after its verdict
  std::vector<int32_t> kept(sampled.size(), 0);  // tokens the state keeps, per verify chunk
  if (on_device) {
    // Each chunk's verdict (in parallel, as the host path's: each owns its rows and its generator).
    parallel_for(0, static_cast<int64_t>(sampled.size()), [&](int64_t lo, int64_t hi) {
      std::unique_ptr<Sampler> sampler = take_sampler();
      for (int64_t i = lo; i < hi; ++i) {
        Sequence& s = *sampled[i].seq;
        const PlannedChunk& c = *sampled[i].chunk;
        const size_t r = sampled[i].row;
        emitted_[i].clear();
        if (c.drafts == 0)
          emitted_[i].push_back(std::move(results_[r]));
        else if (!sample_requests_[r].to_host)
          kept[i] = verdict_of_rows(s, c, std::span<SampleResult>(results_).subspan(r, 1 + static_cast<size_t>(c.drafts)),
                                    emitted_[i]);
        else
          kept[i] = verdict(s, c, logits_.data() + host_row[i] * vocab_, *sampler, emitted_[i]);
      }
      give_sampler(std::move(sampler));
    });
  } else {
    // Sample every row (in parallel: each row is independent and owns its RNG), then deliver in order.
    parallel_for(0, static_cast<int64_t>(sampled.size()), [&](int64_t lo, int64_t hi) {
      std::unique_ptr<Sampler> sampler = take_sampler();
      for (int64_t i = lo; i < hi; ++i) {
        Sequence& s = *sampled[i].seq;
        const float* logits = logits_.data() + sampled[i].row * vocab_;
        emitted_[i].clear();
        if (sampled[i].chunk->drafts > 0) {
          kept[i] = verdict(s, *sampled[i].chunk, logits, *sampler, emitted_[i]);
        } else {
          emitted_[i].push_back(
              sampler->sample({logits, static_cast<size_t>(vocab_)}, s.request.sampling, s.history, s.rng));
        }
      }
      give_sampler(std::move(sampler));
    });
  }
  if (speculative_tokens_ > 0) {
    std::vector<int32_t> settle;
    for (size_t i = 0; i < sampled.size(); ++i)
      if (sampled[i].chunk->drafts > 0) {
        settle.push_back(kept[i]);
        sampled[i].seq->num_computed += kept[i];
      }
    if (!settle.empty()) runner_->settle(settle);
  }
  for (size_t i = 0; i < sampled.size(); ++i) after_sample(*sampled[i].seq, emitted_[i]);
  std::lock_guard lock(metrics_mutex_);
  metrics_.forward_seconds.observe(std::chrono::duration<double>(t1 - t0).count());
  metrics_.sample_seconds.observe(std::chrono::duration<double>(Clock::now() - t1).count());
}

std::unique_ptr<Sampler> Engine::take_sampler() {
  std::lock_guard lock(samplers_mutex_);
  if (samplers_.empty()) return std::make_unique<Sampler>();
  auto s = std::move(samplers_.back());
  samplers_.pop_back();
  return s;
}

void Engine::give_sampler(std::unique_ptr<Sampler> s) {
  std::lock_guard lock(samplers_mutex_);
  samplers_.push_back(std::move(s));
}

void Engine::after_sample(Sequence& s, std::span<const SampleResult> tokens) {
  const auto& stop = s.request.stop;
  RequestUpdate update;
  if (s.request.handover) {  // prefill role: the state and this token go to a decode engine
    TERN_CHECK(tokens.size() == 1, "engine: a handed-over request samples one token");
    const SampleResult& r = tokens.front();
    auto h = std::make_shared<Handover>();
    h->prompt.assign(s.tokens.begin(), s.tokens.begin() + s.prompt_len);
    h->capacity = capacity(s);
    const cache::SequenceState& state = pool_.state(s.id);
    auto bytes = std::make_shared<Tensor>(DType::u8, Shape{static_cast<int64_t>(state.export_bytes())},
                                          options_.handover_on_device ? state.device() : Device::cpu);
    state.export_to(bytes->view());
    h->state = bytes->view();
    h->state_owner = std::move(bytes);
    h->first = {r.token, r.logprob, r.top};
    h->rng = rng_text(s.rng);
    update.handover = std::move(h);
    ++s.generated;
    return finish(s, FinishReason::handover, std::move(update));
  }
  s.state = RequestState::decoding;
  const bool penalised = s.request.sampling.penalised();
  for (const SampleResult& r : tokens) {
    s.tokens.push_back(r.token);
    ++s.generated;
    if (penalised) s.history.add_output(r.token, vocab_);
    const bool is_eos = !stop.ignore_eos && std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(),
                                                      r.token) != options_.eos_token_ids.end();
    const bool is_stop_id = std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), r.token) !=
                            stop.stop_token_ids.end();
    // A stop token counts in completion_tokens and shows in logprobs (as vLLM does), never in the text.
    update.tokens.push_back({r.token, r.logprob, r.top});
    if (is_eos || is_stop_id) return finish(s, FinishReason::stop, std::move(update));
    bool stopped = false;
    update.text += s.text.push(options_.token_bytes(r.token), &stopped);
    if (stopped) return finish(s, FinishReason::stop, std::move(update));
    if (s.generated >= stop.max_tokens || static_cast<int64_t>(s.tokens.size()) >= max_context_)
      return finish(s, FinishReason::length, std::move(update));
  }
  deliver(s, std::move(update));
}

void Engine::deliver(Sequence& s, RequestUpdate update) {
  const auto now = Clock::now();
  update.prompt_tokens = s.prompt_len;
  update.completion_tokens = s.generated;
  if (!update.tokens.empty()) {
    std::lock_guard lock(metrics_mutex_);
    if (s.last_token == Clock::time_point{})
      metrics_.time_to_first_token_seconds.observe(std::chrono::duration<double>(now - s.arrival).count());
    else
      metrics_.inter_token_latency_seconds.observe(std::chrono::duration<double>(now - s.last_token).count());
    s.last_token = now;
  }
  if (s.sink) s.sink(std::move(update));
}

int64_t Engine::capacity_for(int64_t prompt_len, int64_t max_tokens) const {
  return std::min(prompt_len + max_tokens, max_context_);
}

int64_t Engine::capacity(const Sequence& s) const { return capacity_for(s.prompt_len, s.request.stop.max_tokens); }

void Engine::free_state(Sequence& s) {
  if (s.reserved) --reserved_;
  s.reserved = false;
  pool_.release(s.id);
}

void Engine::finish(Sequence& s, FinishReason reason, RequestUpdate update) {
  free_state(s);
  std::erase(running_, s.id);
  std::erase(waiting_, s.id);
  std::erase(remote_, s.id);
  const bool has_text = reason != FinishReason::abort && reason != FinishReason::error && reason != FinishReason::handover;
  if (has_text) update.text += s.text.finish();
  update.finish = reason;
  s.state = reason == FinishReason::abort ? RequestState::aborted : RequestState::finished;
  {
    std::lock_guard lock(metrics_mutex_);
    metrics_.finished_total[static_cast<size_t>(reason)]++;
    metrics_.generation_tokens_total += static_cast<uint64_t>(s.generated);
    metrics_.prompt_tokens_total += static_cast<uint64_t>(s.prompt_len);
    metrics_.e2e_request_latency_seconds.observe(std::chrono::duration<double>(Clock::now() - s.arrival).count());
  }
  deliver(s, std::move(update));
  const uint64_t id = s.id;
  seqs_.erase(id);  // s is gone from here on
  std::lock_guard lock(inbox_mutex_);
  --live_;
}

void Engine::publish_gauges() {
  std::lock_guard lock(metrics_mutex_);
  metrics_.num_running = static_cast<int64_t>(running_.size());
  metrics_.num_waiting = static_cast<int64_t>(waiting_.size() + remote_.size());
  metrics_.num_transferring = reserved_;
  metrics_.state_used_bytes = pool_.used_bytes();
  metrics_.state_total_bytes = pool_.total_bytes();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(metrics_mutex_);
  EngineMetrics m = metrics_;
  std::lock_guard inbox(inbox_mutex_);
  m.num_waiting += static_cast<int64_t>(inbox_.size());
  return m;
}

}  // namespace tern::engine
