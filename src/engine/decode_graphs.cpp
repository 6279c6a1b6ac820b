#include "engine/decode_graphs.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "ops/context.h"

namespace tern::engine {

using model::LogitsFor;
using model::Model;
using model::ModelConfig;
using model::StepSequence;
using model::StepTables;
using model::TrunkRows;

namespace {
constexpr int kCaptureFailed = -2;  // a verify bucket's handle when its capture failed (eager from then on)
std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}
bool is_power_of_10(uint64_t n) {
  while (n % 10 == 0 && n > 1) n /= 10;
  return n == 1;
}
}  // namespace

Tensor eager_step(Model& model, std::span<const StepSequence> batch, bool logits_on_device) {
  const model::StepPlan plan = model.plan_step(batch);
  return model.forward(batch, plan, StepTables::build(plan, model.device()), logits_on_device);
}

std::vector<int64_t> default_decode_buckets(int64_t max_batch) {
  TERN_CHECK(max_batch >= 1, "decode graphs: the largest batch must be >= 1, not ", max_batch);
  std::vector<int64_t> b;
  for (int64_t s : {1, 2, 4, 8, 16, 24, 32})
    if (s < max_batch) b.push_back(s);
  for (int64_t s = 48; s < max_batch; s += 16) b.push_back(s);
  b.push_back(max_batch);
  return b;
}

int64_t pick_decode_bucket(std::span<const int64_t> buckets, int64_t batch) {
  const auto it = std::lower_bound(buckets.begin(), buckets.end(), batch);
  return it == buckets.end() ? -1 : *it;
}

uint64_t DecodeGraphStats::eager_total() const {
  uint64_t n = 0;
  for (const auto& [reason, count] : eager_steps) n += count;
  return n;
}

DecodeGraphs::DecodeGraphs(Model& model, DecodeGraphOptions options)
    : model_(model), options_(std::move(options)) {
  buckets_ = options_.buckets.empty() ? default_decode_buckets(options_.max_batch) : options_.buckets;
  TERN_CHECK(!buckets_.empty() && buckets_.front() >= 1 && std::is_sorted(buckets_.begin(), buckets_.end()) &&
                 std::adjacent_find(buckets_.begin(), buckets_.end()) == buckets_.end(),
             "decode graphs: buckets must be ascending, distinct and >= 1");
  TERN_CHECK(options_.max_tokens >= 1, "decode graphs: max_tokens (the longest sequence) must be set");
  TERN_CHECK(options_.max_queries >= 1 && options_.max_queries <= Model::kMaxStepQueries, "decode graphs: ",
             options_.max_queries, " tokens a sequence (1 to ", Model::kMaxStepQueries, ")");
  layout_ = model_.state_layout(options_.max_tokens, options_.tokens_per_page);
  handles_.assign(buckets_.size() * static_cast<size_t>(options_.max_queries), -1);
  logits_.resize(handles_.size());
  streams_.resize(handles_.size());
  records_.resize(handles_.size());
  mtp_handles_.assign(handles_.size() + buckets_.size(), -1);  // mtp_index
  mtp_logits_.resize(mtp_handles_.size());
  mtp_streams_.resize(mtp_handles_.size());
}

void DecodeGraphs::prepare() {
  if (prepared_) return;
  prepared_ = true;
  if (!options_.enabled) {
    disabled_ = "cuda graphs disabled (--cuda-graphs off)";
  } else if (model_.device() == Device::cpu) {
    disabled_ = "the model is on the CPU";
  } else if ((graphs_ = model_.context().step_graphs()) == nullptr) {  // the backend's, through the model's context
    disabled_ = "the device backend cannot record steps";
  }
  if (!disabled_.empty()) {
    log::info("decode steps run eagerly: ", disabled_);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t largest = buckets_.back(), q_max = options_.max_queries, slots_max = largest * q_max;
  try {
    const int64_t words = StepTables::words(*layout_, slots_max);
    staging_ = TensorView(graphs_->pinned_host(static_cast<size_t>(words) * sizeof(int64_t)), DType::i64, {words});
    tables_ = Tensor(DType::i64, {words}, model_.device());
    // Dry runs, every slot inert: every decode bucket, and with verify steps every bucket of the most tokens a
    // sequence (an op's workspace need is not monotone in the tokens: split-K partials, the grouped MoE kernels
    // from TERN_MOE_GROUPED_MIN_TOKENS, the library path from 512): size the arena (the largest of them), grow the
    // backend's workspace and build its tables before any capture (no workspace may grow inside one).
    // Every graph's shape is measured: with blocks reused within a step, a step's peak need not grow with its slots.
    std::vector<std::pair<int64_t, int64_t>> runs;  // (slots, tokens a sequence), the largest first
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) runs.push_back({*b, 1});
    for (int64_t q = 2; q <= q_max; ++q)
      for (int64_t b : buckets_) runs.push_back({b * q, q});
    struct MtpRun {
      int64_t slots, q;
      bool head;
    };
    std::vector<MtpRun> mtp_runs;  // every MTP graph's (slots, rows a sequence, head)
    if (mtp_graphs())
      for (int64_t b : buckets_)
        for (int64_t q = 1; q <= q_max; ++q) {
          mtp_runs.push_back({b * q, q, false});
          if (q == 1) mtp_runs.push_back({b, 1, true});
        }
    size_t arena = 0;
    const ModelConfig& c = model_.config();
    if (mtp_graphs())  // the MTP rows' hidden input (padding slots: zeros, later stale streams; inert either way)
      mtp_hidden_ = Tensor(DType::f32, {slots_max, c.hc_mult, c.hidden_size}, model_.device());
    const auto measure = [&](int64_t slots, int64_t q, const std::function<void(const StepTables&)>& body) {
      upload_tables({}, slots, q);
      const StepTables t = tables(slots, q);
      graphs_->arena_begin(/*measure=*/true);
      try {
        body(t);
      } catch (...) {
        graphs_->arena_end();
        throw;
      }
      arena = std::max(arena, graphs_->arena_end());
    };
    for (const auto& [slots, q] : runs)
      measure(slots, q, [&, q = q](const StepTables& t) {
        Tensor streams;
        Model::StepRecord record;  // the kept streams and record take arena too
        (void)model_.decode_body(t, &streams, q > 1 ? &record : nullptr);
      });
    for (const MtpRun& r : mtp_runs)  // the MTP layer's rows (drafting rounds, catch-ups): one layer (and the head)
      measure(r.slots, r.q, [&](const StepTables& t) {
        Tensor streams;
        (void)model_.mtp_body(t, mtp_hidden_.view().rows(0, r.slots), &streams, r.head);
      });
    graphs_->arena_reserve(arena);
    stats_.arena_bytes = graphs_->arena_bytes();
    for (size_t i = 0; i < buckets_.size(); ++i) record(i, 1);  // verify buckets (q > 1): on first use
  } catch (const std::exception& e) {
    disabled_ = std::string("capture failed: ") + e.what();
    log::warn("decode steps run eagerly: ", disabled_);
    return;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string list;
  for (int64_t b : buckets_) list += (list.empty() ? "" : " ") + std::to_string(b);
  log::info("cuda graphs: decode steps recorded at startup for batch buckets [", list, "] in ", secs,
            " s; activation arena ", mib(stats_.arena_bytes), " MiB, graphs ", mib(stats_.graph_bytes),
            " MiB (free device memory drop); mixed prefill+decode steps and batches above ", largest,
            " run eagerly");
}

StepTables DecodeGraphs::tables(int64_t slots, int64_t q) const {
  StepTables t(*layout_, model_.device(), slots, q);
  t.view(tables_);
  return t;
}


void DecodeGraphs::upload_tables(std::span<const StepSequence> batch, int64_t slots, int64_t q,
                                 std::span<const int64_t> starts) {
  const StepTables t(*layout_, model_.device(), slots, q);  // (the image needs no views)
  // The page-locked staging is rewritten here while the previous upload's asynchronous copy may still be queued (a
  // decode step's MTP catch-up follows its trunk step with nothing read back between; so do the startup dry runs):
  // wait for the device first. After a step whose results came back (the usual case) the wait costs nothing.
  model_.context().memory()->synchronize();  // (a context with step graphs has its memory: ops/context.h)
  t.fill(std::span<int64_t>(staging_.data_as<int64_t>(), staging_.numel()), batch, starts);
  const int64_t words = t.words();
  // One H2D copy from page-locked memory.
  copy_view(staging_.rows(0, words), tables_.view().rows(0, words));
}

void DecodeGraphs::record(size_t i, int64_t q) {
  const int64_t slots = buckets_[i] * q;
  const size_t g = graph_index(i, q);
  const StepTables t = tables(slots, q);
  Tensor logits, streams;
  Model::StepRecord record;
  handles_[g] = capture_in_arena([&] { logits = model_.decode_body(t, &streams, q > 1 ? &record : nullptr); });
  logits_[g] = std::move(logits);
  streams_[g] = std::move(streams);
  records_[g] = std::move(record);
}

int DecodeGraphs::capture_in_arena(const std::function<void()>& body) {
  graphs_->arena_begin(/*measure=*/false);
  int handle = -1;
  try {
    handle = graphs_->capture(body);
  } catch (...) {
    graphs_->arena_end();
    throw;
  }
  graphs_->arena_end();
  generation_ = graphs_->generation();
  stats_.graph_bytes = graphs_->graph_bytes();
  ++stats_.captures;
  return handle;
}

void DecodeGraphs::forget_graphs() {
  log::info("decode graphs: the backend's workspace moved; recording the buckets again as they are used");
  graphs_->drop_all();
  std::fill(handles_.begin(), handles_.end(), -1);
  std::fill(mtp_handles_.begin(), mtp_handles_.end(), -1);
  for (auto* list : {&logits_, &streams_, &mtp_logits_, &mtp_streams_})
    for (Tensor& t : *list) t = Tensor();
  for (Model::StepRecord& r : records_) r = {};
  generation_ = graphs_->generation();
}

void DecodeGraphs::record_mtp(size_t i, int64_t q, bool head) {
  const int64_t slots = buckets_[i] * q;
  const size_t g = mtp_index(i, q, head);
  const StepTables t = tables(slots, q);
  Tensor logits, streams;
  mtp_handles_[g] =
      capture_in_arena([&] { logits = model_.mtp_body(t, mtp_hidden_.view().rows(0, slots), &streams, head); });
  mtp_logits_[g] = std::move(logits);
  mtp_streams_[g] = std::move(streams);
}

Model::MtpResult DecodeGraphs::eager_mtp(std::span<const Model::MtpStep> steps, const std::string& reason) {
  const uint64_t n = ++stats_.mtp_eager[reason];
  if (n == 1) log::info("decode graphs: MTP rows run eagerly: ", reason);
  const model::StepPlan plan = model_.plan_mtp_step(steps);  // the tables built here, as the replayed rows' are
  return model_.mtp_forward(steps, plan, StepTables::build(plan, model_.device()));
}

Model::MtpResult DecodeGraphs::forward_mtp(std::span<const Model::MtpStep> steps) {
  prepare();
  if (!disabled_.empty()) return eager_mtp(steps, disabled_);
  if (!mtp_graphs()) return eager_mtp(steps, "no MTP graphs (speculation off or no MTP layer)");
  const ModelConfig& c = model_.config();
  const LogitsFor want = steps.empty() ? LogitsFor::last : steps.front().logits;
  std::vector<StepSequence> seqs;
  std::vector<int64_t> starts;
  int64_t q = 1, rows = 0;  // the most rows a sequence, and all of them
  for (const Model::MtpStep& s : steps) {
    const auto n = static_cast<int64_t>(s.next.size());
    if (s.logits != want || want == LogitsFor::all || (want == LogitsFor::last && n != 1) || n < 1 ||
        n > options_.max_queries)
      return eager_mtp(steps, "rows that are neither a drafting round nor a catch-up of a few tokens");
    seqs.push_back({s.state, s.next, LogitsFor::last});  // (decode_refusal's rule for one-token rows)
    starts.push_back(s.start);
    q = std::max(q, n);
    rows += n;
  }
  const std::string refusal = model_.decode_refusal(seqs, *layout_, q, starts);
  if (!refusal.empty()) return eager_mtp(steps, refusal);
  const auto B = static_cast<int64_t>(steps.size());
  const int64_t bucket = pick_decode_bucket(buckets_, B);
  if (bucket < 0) return eager_mtp(steps, "batch above the largest bucket (" + std::to_string(buckets_.back()) + ")");
  const auto i = static_cast<size_t>(std::find(buckets_.begin(), buckets_.end(), bucket) - buckets_.begin());
  const bool head = want == LogitsFor::last;  // a drafting round (q = 1); a catch-up needs no head
  const size_t g = mtp_index(i, q, head);
  if (graphs_->generation() != generation_) forget_graphs();  // the workspace or the arena moved
  if (mtp_handles_[g] == kCaptureFailed) return eager_mtp(steps, "a graph whose capture failed");
  if (mtp_handles_[g] < 0) {
    try {
      record_mtp(i, q, head);
    } catch (const std::exception& e) {
      mtp_handles_[g] = kCaptureFailed;
      log::warn("decode graphs: MTP rows of ", bucket, " sequences x ", q, " run eagerly: capture failed: ", e.what());
      return eager_mtp(steps, "a graph whose capture failed");
    }
  }
  upload_tables(seqs, bucket * q, q, starts);
  for (int64_t k = 0, at = 0; k < B; ++k) {  // each sequence's rows in its consecutive slots
    const TensorView& h = steps[static_cast<size_t>(k)].streams;
    const int64_t n = static_cast<int64_t>(steps[static_cast<size_t>(k)].next.size());
    TERN_CHECK(h.shape() == Shape({n, c.hc_mult, c.hidden_size}), "forward_mtp: streams must be f32 [", n, ", ",
               c.hc_mult, ", ", c.hidden_size, "]");
    copy_view(h, mtp_hidden_.view().rows(at, at + n));
    at += n;
  }
  graphs_->replay(mtp_handles_[g]);
  Model::MtpResult r;
  if (want == LogitsFor::last) model_.mtp_pick(steps, mtp_logits_[g].view().rows(0, B), r);  // q = 1: slot k = row k
  else r.logits = Tensor(DType::f32, {0, c.vocab_size});  // a catch-up: no row wanted
  r.streams = Tensor(DType::f32, {rows, c.hc_mult, c.hidden_size}, model_.device(), TensorInit::uninitialized);
  copy_view(mtp_streams_[g].view().rows(0, rows), r.streams);
  ++stats_.mtp_graph_steps;
  return r;
}

Tensor DecodeGraphs::forward(std::span<const StepSequence> batch) { return step(batch, false, nullptr); }

TensorView DecodeGraphs::forward_device(std::span<const StepSequence> batch, Tensor& hold) {
  TensorView view;
  hold = step(batch, true, &view);
  return view;
}

Tensor DecodeGraphs::forward_trunk(std::span<const StepSequence> batch, bool want_record, TrunkRows& out) {
  out = {};
  return step(batch, false, nullptr, &out, want_record);
}

TensorView DecodeGraphs::forward_trunk_device(std::span<const StepSequence> batch, bool want_record, TrunkRows& out,
                                              Tensor& hold) {
  out = {};
  TensorView view;
  hold = step(batch, true, &view, &out, want_record);
  return view;
}

Tensor DecodeGraphs::eager(std::span<const StepSequence> batch, const std::string& reason, bool on_device,
                           TensorView* view, TrunkRows* trunk, bool want_record) {
  const uint64_t n = ++stats_.eager_steps[reason];
  if (n == 1) log::info("decode graphs: a step runs eagerly: ", reason);
  else if (is_power_of_10(n)) log::info("decode graphs: ", n, " steps ran eagerly so far: ", reason);
  Tensor logits;
  if (trunk != nullptr) {
    const model::StepPlan plan = model_.plan_step(batch);
    logits = model::eager_trunk(model_, batch, plan, StepTables::build(plan, model_.device()), want_record, on_device,
                                eager_streams_, eager_record_, *trunk);
  } else {
    logits = eager_step(model_, batch, on_device);
  }
  if (view != nullptr) *view = logits.view();
  return logits;
}

Tensor DecodeGraphs::step(std::span<const StepSequence> batch, bool on_device, TensorView* view, TrunkRows* trunk,
                          bool want_record) {
  prepare();
  const auto eager = [&](const std::string& reason) {
    return this->eager(batch, reason, on_device, view, trunk, want_record);
  };
  if (!disabled_.empty()) return eager(disabled_);
  // q: the tokens every sequence brings (1: a decode step; 2 ..: a verify step, every row's logits wanted).
  const int64_t q = batch.empty() ? 1 : static_cast<int64_t>(batch.front().tokens.size());
  const bool verify = q > 1 && q <= options_.max_queries &&
                      std::all_of(batch.begin(), batch.end(), [&](const StepSequence& s) {
                        return static_cast<int64_t>(s.tokens.size()) == q && s.logits == LogitsFor::all;
                      });
  const std::string refusal = model_.decode_refusal(batch, *layout_, verify ? q : 1);
  if (!refusal.empty()) return eager(refusal);
  const int64_t qs = verify ? q : 1;
  const auto B = static_cast<int64_t>(batch.size());
  const int64_t bucket = pick_decode_bucket(buckets_, B);
  if (bucket < 0)
    return eager("batch above the largest bucket (" + std::to_string(buckets_.back()) + ")");
  const int64_t slots = bucket * qs;
  const auto i = static_cast<size_t>(std::find(buckets_.begin(), buckets_.end(), bucket) - buckets_.begin());
  const size_t g = graph_index(i, qs);
  if (graphs_->generation() != generation_) forget_graphs();  // the workspace or the arena moved
  if (handles_[g] == kCaptureFailed) return eager("a verify bucket whose capture failed");
  if (handles_[g] < 0) {
    try {
      record(i, qs);
    } catch (const std::exception& e) {
      if (qs > 1) {  // this verify bucket alone runs eagerly; the decode graphs stay
        handles_[g] = kCaptureFailed;
        log::warn("decode graphs: verify steps of ", bucket, " sequences x ", qs, " tokens run eagerly: capture failed: ",
                  e.what());
        return eager("a verify bucket whose capture failed");
      }
      disabled_ = std::string("capture failed: ") + e.what();
      log::warn("decode steps run eagerly from now on: ", disabled_);
      return eager(disabled_);
    }
  }
  upload_tables(batch, slots, qs);
  graphs_->replay(handles_[g]);
  const int64_t vocab = model_.config().vocab_size, rows = B * qs;  // every row of a verify step; one a decode
  Tensor logits;
  if (on_device) {
    *view = logits_[g].view().rows(0, rows);  // read (sampled) before the next replay
  } else {
    logits = Tensor(DType::f32, {rows, vocab});
    copy_view(logits_[g].view().rows(0, rows), logits);
  }
  if (trunk != nullptr) {
    trunk->streams = streams_[g].view().rows(0, rows);
    trunk->record = qs > 1 && want_record ? &records_[g] : nullptr;
  }
  Model::decode_done(batch);
  ++stats_.graph_steps;
  return logits;
}

}  // namespace tern::engine
