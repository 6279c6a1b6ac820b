// The decode side of prefill-decode disaggregation: requests whose prompt ran on another engine get
// state memory reserved, receive the prompt's state and first token, and then decode like any other.
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_sequence.h"

namespace tern::engine {

std::string rng_text(const std::mt19937_64& rng) {
  std::ostringstream out;
  out << rng;
  return out.str();
}

std::mt19937_64 rng_from_text(const std::string& text) {
  std::istringstream in(text);
  std::mt19937_64 rng;
  in >> rng;
  TERN_CHECK(!in.fail(), "handover: the random generator state is malformed");
  in >> std::ws;
  TERN_CHECK(in.eof(), "handover: trailing bytes after the random generator state");
  return rng;
}

uint64_t Engine::submit_remote(GenerationRequest request, UpdateSink sink, std::function<void()> on_reserved) {
  TERN_CHECK(!request.handover, "a remote request cannot itself be handed over");
  auto seq = make_sequence(std::move(request), std::move(sink));
  seq->remote = true;
  seq->state = RequestState::transferring;
  seq->on_reserved = std::move(on_reserved);
  return enqueue(std::move(seq));
}

void Engine::provide_state(uint64_t id, std::shared_ptr<const Handover> handover, std::function<void(std::string)> done) {
  std::lock_guard lock(inbox_mutex_);
  provided_.push_back({id, std::move(handover), std::move(done)});
  ++events_;
  inbox_cv_.notify_one();
}

// Reserves state memory for the prompt and first token of remote requests, oldest first, while pages
// and the running cap allow (a fresh state in the pool: the import target).
void Engine::reserve_remote() {
  while (!remote_.empty()) {
    Sequence& s = *seqs_.at(remote_.front());
    if (static_cast<int64_t>(running_.size()) + reserved_ >= options_.limits.max_running) break;
    if (!pool_.reserve(s.id, s.prompt_len + 1)) break;
    remote_.pop_front();
    s.reserved = true;
    ++reserved_;
    if (auto cb = std::exchange(s.on_reserved, nullptr)) cb();
  }
}

void Engine::import_state(const Provided& p) {
  auto it = seqs_.find(p.id);
  if (it == seqs_.end()) {
    if (p.done) p.done("the request is no longer in the engine (aborted or failed)");
    return;
  }
  Sequence& s = *it->second;
  std::string error;
  try {
    TERN_CHECK(s.reserved, "request ", s.id, " has no reserved state memory (not a remote request, or already provided)");
    const Handover& h = *p.handover;
    TERN_CHECK(static_cast<int64_t>(h.prompt.size()) == s.prompt_len &&
                   std::equal(h.prompt.begin(), h.prompt.end(), s.tokens.begin()),
               "the prefill server ran another prompt (", h.prompt.size(), " tokens) than this request's (", s.prompt_len,
               " tokens): do both servers use the same tokenizer and chat template?");
    TERN_CHECK(h.capacity == capacity(s), "the prefill server sized the state for ", h.capacity,
               " positions, this server for ", capacity(s), ": do both servers use the same --max-model-len?");
    TERN_CHECK(h.first.token >= 0 && h.first.token < vocab_, "the first token ", h.first.token,
               " is outside the vocabulary");
    const std::mt19937_64 rng = rng_from_text(h.rng);
    cache::SequenceState& state = pool_.state(s.id);
    state.import_from(h.state);  // checks the layout and page geometry; changes nothing when it throws
    if (state.position() != s.prompt_len) {
      const int64_t got = state.position();
      state.reset();
      throw Error(cat("the state is at position ", got, ", the prompt has ", s.prompt_len, " tokens"));
    }
    s.rng = rng;
    s.num_computed = s.prompt_len;
    s.reserved = false;
    --reserved_;
    running_.insert(std::upper_bound(running_.begin(), running_.end(), s.id), s.id);
    // The first token as if sampled here: penalties' counts, stop rules, text and delivery.
    const SampleResult first{h.first.token, h.first.logprob, h.first.top};
    after_sample(s, {&first, 1});
  } catch (const std::exception& e) {
    error = e.what();
    log::warn("request ", p.id, ": state import refused: ", error);
    if (seqs_.count(p.id)) {
      RequestUpdate u;
      u.error = cat("state transfer: ", error);
      finish(s, FinishReason::error, std::move(u));
    }
  }
  if (p.done) p.done(error);
}

}  // namespace tern::engine
