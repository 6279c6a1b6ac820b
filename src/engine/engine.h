// The executor: owns the model runner, the state pool and every live request, and runs steps
// (schedule -> forward -> sample -> deliver) on its own thread. submit() and abort() may be called from
// any thread; a request's sink is called from the engine thread and must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/handover.h"
#include "engine/metrics.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/state_pool.h"

namespace tern::engine {

struct EngineOptions {
  int64_t state_memory_bytes = int64_t{512} << 20;
  int64_t tokens_per_page = 0;  // tokens of context per state page; 0: the cache's default (cache/README.md)
  SchedulerLimits limits;
  std::vector<int32_t> eos_token_ids;
  // The bytes a token adds to the output text ("" for special tokens). Required.
  std::function<std::string(int32_t)> token_bytes;
  // Prefill role: the handed-over state stays on the model's device (for a transfer backend that reads
  // device memory: cuda-ipc, nccl) instead of crossing to the host.
  bool handover_on_device = false;
  // Speculative decoding, when the runner speculates (ModelRunner::speculative_tokens() > 0; docs/mtp.md):
  // sequences draft only in steps where at most this many sequences decode (0: always): `--speculative auto`'s
  // threshold, above which verifying costs more than it saves.
  int speculative_max_batch = 0;
  // Benchmarks only (`--speculative-oracle-accept p`): each draft is kept with probability p whatever the target
  // says, and the drafts are emitted: the output is NOT the model's. Measures the machinery at a chosen acceptance
  // on weights whose drafts are never right. < 0: off (the exact verdict).
  double oracle_accept = -1;
};

class Engine {
 public:
  Engine(std::shared_ptr<ModelRunner> runner, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (throws tern::Error with a message for the client) and queues the request.
  uint64_t submit(GenerationRequest request, UpdateSink sink);
  // The request ends with FinishReason::abort and its state is freed at the start of the next step.
  void abort(uint64_t id);
  void abort_all();
  // The request ends with FinishReason::error and this message (e.g. its state transfer failed); its
  // state memory is freed at the start of the next step.
  void fail(uint64_t id, std::string message);

  // Decode role (prefill-decode disaggregation; engine_remote.cpp). A request whose prompt another
  // engine runs: validated as submit() does, then state memory for its prompt and first token is
  // reserved (in arrival order, before new prompts are admitted) and `on_reserved` is called on the
  // engine thread (it must not block). provide_state() then hands over the prompt's state and first
  // token; the request decodes like any other from there, with output identical to running it here.
  uint64_t submit_remote(GenerationRequest request, UpdateSink sink, std::function<void()> on_reserved);
  // Imports the state on the engine thread and calls `done` there with "" or why it was refused (the
  // request then finishes with FinishReason::error and that message).
  void provide_state(uint64_t id, std::shared_ptr<const Handover> handover, std::function<void(std::string)> done);

  void start();  // runs steps on the engine thread until stop()
  void stop();   // aborts what is left and joins the thread
  // One step on the caller's thread (when not started); false when there was nothing to do.
  bool step();
  bool idle() const;  // no request waiting or running

  EngineMetrics metrics() const;
  // State positions a request's sequence is opened with (prompt + max_tokens, within the context): a
  // prefill and a decode engine must agree on it to move the state.
  int64_t capacity_for(int64_t prompt_len, int64_t max_tokens) const;
  // Tokens of context the whole state memory holds (one sequence with every page): the default bound of
  // what one request, and one client, may hold in flight (server/admission.h).
  int64_t state_capacity_tokens() const;
  const ModelRunner& runner() const { return *runner_; }
  const StatePool& pool() const { return pool_; }
  const EngineOptions& options() const { return options_; }
  std::string memory_plan() const;  // human-readable, for the startup log

 private:
  using Clock = std::chrono::steady_clock;
  struct Sequence;

  struct Provided {
    uint64_t id = 0;
    std::shared_ptr<const Handover> handover;
    std::function<void(std::string)> done;
  };

  void loop();
  void drain_inbox();
  std::unique_ptr<Sequence> make_sequence(GenerationRequest request, UpdateSink sink);
  uint64_t enqueue(std::unique_ptr<Sequence> seq);
  int64_t capacity(const Sequence& s) const;
  void reserve_remote();
  void import_state(const Provided& p);
  void apply_plan(const BatchPlan& plan);
  void run_batch(const BatchPlan& plan);
  // Appends a step's tokens for `seq` (one, or a verify step's kept drafts and next token) through the stop
  // rules and delivers one update; tokens after a stop are dropped.
  void after_sample(Sequence& seq, std::span<const SampleResult> tokens);
  // Speculative decoding (engine_speculative.cpp): how many drafts `seq` may verify this step; the drafts of the
  // plan's verify chunks (runner draft(), choices from each request's sampling); the verdict of one verify chunk
  // from its k + 1 rows of logits (its kept tokens into `out`, returns how many of its tokens the state keeps).
  int64_t lookahead(const Sequence& seq, bool speculate) const;
  void draft(const BatchPlan& plan);
  int32_t verdict(Sequence& seq, const PlannedChunk& c, const float* logits, Sampler& sampler,
                  std::vector<SampleResult>& out);
  // With device sampling: whether seq's verify rows are sampled where the logits are (its verdict needs only the
  // target's own choices: greedy, and for the oracle no logprobs), else its rows come to the host for verdict();
  // the requests of those rows (the history of row j extended by drafts 1 .. j when penalised; into
  // verify_histories_); and the verdict from the sampled rows (the same as verdict() on the same logits).
  bool verdict_on_device(const Sequence& seq) const;
  void verify_requests(Sequence& seq, const PlannedChunk& c, std::span<SampleRequest> rows);
  int32_t verdict_of_rows(Sequence& seq, const PlannedChunk& c, std::span<SampleResult> rows,
                          std::vector<SampleResult>& out);
  void count_verdict(int64_t drafts, int64_t accepted);
  // The oracle's acceptance (benchmarks only): how many of `drafts` it keeps, each with probability oracle_accept
  // drawn from the sequence's generator until the first refusal.
  int64_t oracle_accepts(Sequence& seq, int64_t drafts) const;
  void finish(Sequence& seq, FinishReason reason, RequestUpdate update);
  void deliver(Sequence& seq, RequestUpdate update);
  void free_state(Sequence& seq);
  void publish_gauges();
  std::unique_ptr<Sampler> take_sampler();
  void give_sampler(std::unique_ptr<Sampler> s);
  std::vector<SchedSeq> sched_view(const std::vector<uint64_t>& ids, bool speculate) const;
  bool speculate_now() const;          // whether this step's decoding sequences draft (the auto threshold)
  std::string speculative_plan() const;  // memory_plan()'s speculative part ("" when off)

  std::shared_ptr<ModelRunner> runner_;
  EngineOptions options_;
  StatePool pool_;
  std::mutex samplers_mutex_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // scratch, one per sampling thread
  std::vector<SampleResult> results_;
  std::vector<double> uniforms_;                 // device sampling: the rows' uniforms
  std::vector<SampleRequest> sample_requests_;   // device sampling: the rows' requests
  std::deque<TokenHistory> verify_histories_;    // device sampling: verify rows' histories with their drafts
  int64_t vocab_ = 0;
  int64_t max_context_ = 0;

  // Engine-thread state.
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;  // oldest (smallest id) first
  std::deque<uint64_t> remote_;    // submit_remote requests waiting for state memory, in arrival order
  int64_t reserved_ = 0;           // remote requests holding state memory, awaiting their state
  StepBatch batch_;
  std::vector<float> logits_;
  std::vector<std::vector<SampleResult>> emitted_;  // per sampled chunk of the step: its tokens
  // Speculative decoding: drafts per runner draft round (k, 0: off); the step's drafts and their distributions
  // (q, [drafts][vocab] for sampled requests), by sequence id.
  int speculative_tokens_ = 0;
  std::unordered_map<uint64_t, std::vector<int32_t>> drafts_;
  std::unordered_map<uint64_t, std::vector<float>> draft_dists_;

  // Shared with submit/abort callers.
  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<uint64_t> aborts_;
  std::vector<std::pair<uint64_t, std::string>> failures_;
  std::vector<Provided> provided_;
  uint64_t events_ = 0;  // inbox changes, so the loop sleeps while only transfers are pending
  bool abort_everything_ = false;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  size_t live_ = 0;  // submitted and not yet finished

  mutable std::mutex metrics_mutex_;
  EngineMetrics metrics_;
  std::thread thread_;
};

}  // namespace tern::engine
