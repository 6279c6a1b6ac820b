// The DeepSeek-V4 forward pass as a sequence of op calls (deepseek-v4.md section 2), over a batch of
// sequences that each bring their own state and a chunk of new tokens.
//
//   Model model(weights, KvMode::exact);
//   cache::SequenceState state = model.new_state(/*max_tokens=*/4096);
//   Tensor logits = model.forward({{&state, prompt, LogitsFor::last}});   // f32 [1, vocab]
//
// One forward() call mixes prefill chunks and single decode tokens freely: every linear layer runs over
// all tokens of the batch at once; attention, the compressors and the indexer run per sequence against
// its state. Each state is advanced by its chunk's length.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/sequence_state.h"
#include "core/tensor.h"
#include "model/step_sequence.h"
#include "model/step_tables.h"
#include "model/weights.h"
#include "ops/act_quant.h"
#include "ops/context.h"
#include "ops/kv_row.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace tern::model {

// exact: window and compressed rows kept in fp32. fp8: DeepSeek's FP8 rows (ops/kv_row.h), so attention
// sees the official reference's rounding.
enum class KvMode : uint8_t { exact, fp8 };

class Model {
 public:
  // Every op of the model runs in `ctx` (ops/context.h), a context of the device its weights are on: the
  // host's until to_device moves them, then set_context gives the device's.
  Model(ModelWeights weights, KvMode mode, const ops::Context& ctx);

  // Moves the model to `device`: every weight view is replaced by `upload(view)` in place (a copy on the device
  // that the caller keeps alive, e.g. cuda::WeightStore::upload; empty views stay empty), and from then on
  // forward() allocates its intermediates there (from the context's memory: tensor() below), new_state() makes
  // device states, and only the logits come back to the host. The observer then sees device views.
  using Upload = std::function<TensorView(const TensorView&)>;
  void to_device(Device device, const Upload& upload);
  Device device() const { return device_; }
  // The context every op of forward() runs in (ops/context.h): the constructor's until set_context gives
  // another (app/device.cpp does after to_device: the backend it made for the model's device). Its device
  // must be the model's.
  void set_context(const ops::Context& ctx);
  const ops::Context& context() const { return ctx_; }
  // Which of two same-bits paths the forward takes (A/B switches; `tern bench-step --ab` flips them in one
  // process): hc_fold, each sub-layer's hc_post folded into the next hc_pre (TERN_HC_FOLD=0 at startup: off);
  // fused_compress, a compressor's emit chain as one step_compress_emit where the backend has it
  // (TERN_FUSED_COMPRESS=0: five ops).
  struct Paths {
    bool hc_fold = true, fused_compress = true;
    // Weights asked into L2 ahead of their products at steps of up to kPrefetchMaxTokens tokens (ops::prefetch;
    // TERN_L2_PREFETCH, a sum of the L2Prefetch bits).
    int l2_prefetch = 0;
    // The attention output's inverse RoPE in the step attention (ops::StepAttentionArgs::inv_freq) rather than a
    // rope op after it (TERN_FUSED_ROPE=0: the op; the same bits).
    bool fused_rope = true;
    // hc_pre leaves post and comb to ops::hc_comb on a side branch (the Sinkhorn off the step's path) in steps of up
    // to this many tokens (TERN_HC_COMB_APART; 0: never; the same bits either way). Measured on the H100 (results.md,
    // session 26): 0 to -1.0% at batch 1, +0.3 / +0.6% at 16 / 64 when always apart.
    int hc_comb_apart = 8;
  };
  // Where the forward asks weights into L2 (Paths::l2_prefetch), each while latency-bound kernels leave DRAM idle:
  enum L2Prefetch : int {
    kPrefetchWoA = 1,      // wo_a, after wq_b's product (the indexer and the attention run before wo_a)
    kPrefetchWoB = 2,      // wo_b, after wq_b's product too
    kPrefetchNextQ = 4,    // the next layer's wq_a|wkv and wq_b, after the MoE (its combine, hc_pre before them)
    kPrefetchAll = 7,
  };
  static constexpr int64_t kPrefetchMaxTokens = 256;
  static constexpr int kHcCombApartLimit = 1 << 20;  // TERN_HC_COMB_APART's largest value
  void set_paths(const Paths& p) { paths_ = p; }
  const Paths& paths() const { return paths_; }

  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  KvMode kv_mode() const { return mode_; }
  // Which activations the products see (ops/act_quant.h): native (the default); fp8, the official reference's
  // act_quant before each FP8 and FP4 product (attention projections, the indexer's wq_b, shared expert, MTP
  // projections, the routed experts' x and h; not the bf16 products); or f32, the exact mode (every weight
  // `exact`, the head and the experts included). Kept across to_device.
  void set_activations(ops::Activations a);
  ops::Activations activations() const { return act_; }
  ops::KvRowFormat kv_format() const;
  // Every weight forward() passes to linear() or grouped_linear(), with its groups (kernel tuning).
  std::vector<ops::LinearUse> linears() const;
  // The routed experts layer `layer` passes to moe_experts() (benchmarks).
  std::span<const ops::Expert> routed_experts(int l) const { return layer(l).ffn.experts; }

  // The state layout of one sequence of at most max_tokens tokens in pages of tokens_per_page tokens (0: the
  // cache's default), and a fresh (empty) standalone state with pages for max_tokens on the model's device.
  // A server makes one cache::PagePool of state_layout(max_context) on device() and its states from it.
  std::shared_ptr<const cache::StateLayout> state_layout(int64_t max_tokens, int64_t tokens_per_page = 0) const;
  cache::SequenceState new_state(int64_t max_tokens) const;

  // What a step on the step tables keeps for rollback_step (speculative decoding's verify steps): per trunk layer
  // the step's window rows and its compressors' kv / gate projections, every token of the step. forward(...,
  // record) fills it when the step runs on the tables (left empty otherwise).
  struct StepRecord {
    struct Compressor {
      Tensor storage[3];  // what kv and gate view
      TensorView kv, gate;
    };
    struct Layer {
      Tensor rows;  // u8 [N, kv_row_bytes]
      Compressor compressor, indexer;
    };
    std::vector<Layer> layers;
  };

  // Runs the batch; returns logits f32 [rows, vocab]: each sequence's requested rows, in batch order
  // (all: one per token, last: one, none: nothing). On the host, or with logits_on_device on the model's
  // device (no copy back: a device sampler reads them there).
  // plan: plan_step(batch); tables: StepTables::build of it, built by whoever runs the step (the runner), read here.
  Tensor forward(std::span<const StepSequence> batch, const StepPlan& plan, const std::optional<StepTables>& tables,
                 bool logits_on_device = false);
  // The same, and the trunk's 4-stream hidden before hc_head, f32 [rows, hc, D], of the rows streams_for[i]
  // picks of sequence i (none / last / all; one entry per sequence), in batch order, into `streams` on the
  // model's device: what the MTP layer reads (mtp_forward).
  Tensor forward(std::span<const StepSequence> batch, const StepPlan& plan, const std::optional<StepTables>& tables,
                 std::span<const LogitsFor> streams_for, Tensor& streams, bool logits_on_device = false,
                 StepRecord* record = nullptr);
  // Both with the batch planned and its tables built here: for tests and tools that run the model directly.
  Tensor forward(std::span<const StepSequence> batch, bool logits_on_device = false);
  Tensor forward(std::span<const StepSequence> batch, std::span<const LogitsFor> streams_for, Tensor& streams,
                 bool logits_on_device = false, StepRecord* record = nullptr);

  // Rolls a sequence back after a recorded step that brought it tokens from batch row `first_row` on: with its
  // state restored to `before` (its snapshot from before that step), the window rows of its first `kept` tokens are
  // stored again and their compressor inputs refolded into the accumulators (the entries they close are stored
  // again, the same bits), so the state is the one a step of only those tokens leaves, without running the layers
  // again (compressed rows and indexer keys past the kept tokens lie beyond the restored counts). The MTP layer's
  // window is the caller's (generate puts it back from a copy).
  void rollback_step(cache::SequenceState& state, const cache::Snapshot& before, const StepRecord& record,
                     int64_t first_row, int64_t kept);
  // The same for several sequences of one recorded step at once: one launch per op and layer for all of them (the
  // kept tokens in the recorded step's slots, the others inert), where rollback_step per sequence launched them
  // once per sequence. The states must be distinct and share one page geometry; their row ranges must not overlap.
  struct Rollback {
    cache::SequenceState* state = nullptr;
    const cache::Snapshot* before = nullptr;
    int64_t first_row = 0;  // its first token's row in the recorded step
    int64_t kept = 0;       // 1 .. kMaxStepQueries
  };
  // The tables are built here (plan_rollback, below): tests, tools and the Speculator call it.
  void rollback_steps(std::span<const Rollback> seqs, const StepRecord& record);

  // The MTP layer (model/v4_mtp.cpp; present when the checkpoint has mtp.0.*). Row i of a sequence, at
  // position p = start + i, reads the hidden h_p (the trunk's streams of position p, or when chaining drafts
  // the MTP's own output streams of position p - 1) and the token at p + 1, and predicts the token at p + 2:
  //   x_k  = e_proj(enorm(embed(next))) + h_proj(hnorm(h_k))      per stream k (the e term is shared)
  //   X'   = V4 block (SWA-only attention with the MTP layer's own window ring, score-routed MoE, its mHC)
  //   logits = head(norm(hc_head_mtp(X')))
  // The window is the state's layer mtp_layer(), addressed by position like the trunk's rings: row p lands in
  // slot p % window and a row at p attends to positions p-window+1 .. p. So the positions below `start` that
  // the window reaches must have gone through mtp_forward on this state before (prompt catch-up: during
  // prefill, every prompt position whose next token is known). The state's position is not changed.
  bool has_mtp() const { return w_.mtp.has_value(); }
  int mtp_layer() const { return w_.config.num_layers; }
  struct MtpStep {
    cache::SequenceState* state = nullptr;  // its MTP window is read and written
    int64_t start = 0;                      // position of the first row
    TensorView streams;                     // f32 [n, hc, D] on the model's device: h at start .. start+n-1
    std::span<const int64_t> next;          // n tokens: the tokens at start+1 .. start+n
    LogitsFor logits = LogitsFor::all;
    // The wanted rows' argmax instead of their logits, taken where the logits are (a greedy draft: no vocab-wide
    // row crosses to the host).
    bool argmax = false;
  };
  struct MtpResult {
    Tensor logits;   // f32 [rows, vocab] on the host: the requested rows of the steps without argmax, in batch order
    std::vector<int64_t> argmax;  // per requested row of every step, in batch order: its argmax (argmax steps)
    Tensor streams;  // f32 [N, hc, D] on the model's device: the block's output (before hc_head) of every row,
                     // in batch order: the hidden of the next chained draft step
  };
  // plan: plan_mtp_step(batch) (every row on the tables, or none); tables: built from it by the caller.
  MtpResult mtp_forward(std::span<const MtpStep> batch, const StepPlan& plan, const std::optional<StepTables>& tables);
  // The same with the tables built here (tests, tools, the Speculator's own drafting).
  MtpResult mtp_forward(std::span<const MtpStep> batch);
  // What mtp_forward returns of its wanted rows' logits `all` (f32 [W, vocab] on the model's device, W = the rows
  // `batch` wants, in batch order): the argmax steps' rows picked there, the others' rows on the host.
  void mtp_pick(std::span<const MtpStep> batch, const TensorView& all, MtpResult& r) const;

  // Intermediates of forward(), for tests and debugging (the views live only during the call):
  //   "attn_in", "attn_out", "ffn_in", "ffn_out" [N, D]; "streams" [N, hc, D] after the layer;
  //   "kv" [N, head_dim] window rows before the KV format; "compressed_kv" [n, head_dim] and "index_keys"
  //   [n, index_head_dim] entries emitted for one sequence (after norm + RoPE); "indexer_topk" i32 [n, k]
  //   for one sequence; "final_hidden" [rows, D] (layer -1) the head's input. N = all tokens of the batch.
  using Observer = std::function<void(std::string_view name, int layer, const TensorView& t)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }
  bool has_observer() const { return static_cast<bool>(observer_); }

  // Steps on the step tables (model/v4_decode.cpp): every sequence brings 1 <= q <= kMaxStepQueries tokens (a
  // decode token, or k + 1 tokens to verify); the step is laid out in slots, one token each, and each op runs once
  // for all slots, reading per-slot positions, sequences and state addresses from device tables (model/step_tables.h,
  // built by whoever runs the step). Same arithmetic per token as the per-sequence chunk path. forward() runs every
  // sequence it can this way (sequence_refusal; plan_step says which), on the tables its caller built from that
  // plan, and those it cannot (prefill chunks) per sequence in the same step (a mixed step); the runner's CUDA graphs
  // record steps wholly on the tables (engine/decode_graphs.h: decode steps and verify steps), on tables of their own.
  static constexpr int64_t kMaxStepQueries = StepTables::kMaxQueries;
  // How forward(batch) lays the batch on the step tables: the sequences the tables take (1..kMaxStepQueries tokens,
  // the first such state's page geometry), in batch order; empty with the tables off, an observer set, or every
  // sequence refused.
  StepPlan plan_step(std::span<const StepSequence> batch) const;
  // How mtp_forward(batch) does: every sequence's rows (1..kMaxStepQueries a sequence, at their starts) when the
  // tables take them all, else none (the rows run per sequence).
  StepPlan plan_mtp_step(std::span<const MtpStep> batch) const;
  // Why `batch` cannot run on the step tables for states of `layout` (at most its max_tokens tokens, in pages of
  // its geometry) with up to max_queries tokens a sequence; empty: it can. A recorded decode step (max_queries
  // 1) also needs every sequence to want its logits.
  // starts: each sequence's first position when not its state's (the MTP layer's rows trail the state).
  std::string decode_refusal(std::span<const StepSequence> batch, const cache::StateLayout& layout,
                             int64_t max_queries = 1, std::span<const int64_t> starts = {}) const;
  // Why one sequence's tokens cannot run on the step tables with up to max_queries tokens a sequence (too many
  // tokens for the step kernels, no state, no pages for them); empty: they can. forward() sends the sequences
  // it refuses per sequence and the others on the tables, in one step.
  std::string sequence_refusal(const StepSequence& s, int64_t max_queries, int64_t start = -1) const;
  // Tokens forward() has run on the step tables and per sequence since the model was made (a mixed step counts in
  // both): which path a step took, for tests and the profile.
  struct StepPaths {
    int64_t table_tokens = 0, chunk_tokens = 0, mixed_steps = 0;
  };
  const StepPaths& step_paths() const { return step_paths_; }
  // Whether forward() runs the steps it can on the step tables (the default) or every step on the per-sequence
  // chunk path (tests compare the two; A/B).
  void set_step_tables(bool on) { step_tables_ = on; }
  // The device work of one step on tables t (up to t.max_queries() tokens a sequence: 1 for a decode step, k + 1 for
  // a verify step): no host synchronisation, no host data, every shape a function of the slots and max_queries
  // alone (so it can be captured once and replayed). Returns the device logits f32 [slots, vocab] (padding rows
  // are garbage-free but meaningless). Does not advance the states (decode_done).
  // With streams_out: the trunk streams of every slot, f32 [slots, hc, D] (what the MTP layer reads); with record:
  // the step's StepRecord (a verify step's rollback), both left in the step's memory (a graph's arena).
  Tensor decode_body(const StepTables& t, Tensor* streams_out = nullptr, StepRecord* record = nullptr);
  // After the step ran: each sequence of the batch has consumed its tokens.
  static void decode_done(std::span<const StepSequence> batch);
  // The MTP layer's rows on the step tables, as decode_body is the trunk's (captured by engine::DecodeGraphs for
  // drafting rounds and catch-ups): one row a slot at the tables' positions (up to t.max_queries() rows a sequence),
  // ids the next tokens, hidden f32 [slots, hc, D] on the device (each slot's h). Returns the device logits
  // f32 [slots, vocab] of every slot and, in *streams_out, the block's output streams [slots, hc, D] (the next
  // chained row's hidden), both in the step's memory. The same bits per row as mtp_forward's on the tables.
  // Without `logits` (a catch-up's rows) the head is skipped and an empty tensor returned.
  Tensor mtp_body(const StepTables& t, const TensorView& hidden, Tensor* streams_out, bool logits = true);


 private:
  struct Batch;
  // Lays the batch out: the sequences marked in on_tables (if any) first, in batch order, then the others; b.seqs
  // keeps the batch's order (so do the wanted rows).
  Batch make_batch(std::span<const StepSequence> batch, std::span<const char> on_tables = {}) const;
  // Which of batch's sequences `plan` puts on the tables (on[i]; its sequences, in batch order).
  static std::vector<char> on_tables(std::span<const StepSequence> batch, const StepPlan& plan);
  // Why a state of layout `state` cannot share tables bound by `layout` (longer, or pages of another geometry).
  static std::string geometry_refusal(const cache::StateLayout& state, const cache::StateLayout& layout);
  static bool same_page_geometry(const cache::StateLayout& a, const cache::StateLayout& b) {
    return a.page_bytes() == b.page_bytes() && a.tokens_per_page() == b.tokens_per_page();
  }
  // Points b at tables t: a step wholly on them (every row a slot).
  static void use_tables(Batch& b, const StepTables& t);
  // The MTP rows' checks (mtp_forward's, before anything runs).
  void check_mtp_steps(std::span<const MtpStep> batch) const;
  // rollback_steps in two: plan_rollback checks the sequences (before any state is restored) and gives the tables'
  // plan, the kept tokens as a step of their own, each in its recorded slots at its snapshot's positions; the second
  // restores the states and refolds on tables built from that plan. Private: only rollback_steps pairs them, so no
  // caller can hand tables the sequences were not checked against.
  StepPlan plan_rollback(std::span<const Rollback> seqs, const StepRecord& record) const;
  void rollback_steps(std::span<const Rollback> seqs, const StepRecord& record, const StepTables& tables);
  // Fills b's ids (token t of sequence i: ids_of(i)[t]), positions (start + t) and wanted rows from b.seqs, and
  // puts them on the model's device; shared by the trunk's and the MTP layer's batches.
  void lay_out_tokens(Batch& b, const std::function<std::span<const int64_t>(size_t)>& ids_of) const;
  std::vector<cache::LayerSpec> make_layer_specs() const;
  // Marks the weights the activations mode applies to.
  void apply_activations();
  Tensor forward_impl(std::span<const StepSequence> batch, const StepPlan& plan,
                      const std::optional<StepTables>& tables, std::span<const LogitsFor> streams_for, Tensor* streams,
                      bool logits_on_device, StepRecord* record);
  // compress_step's second half: the entries of the step's tokens from their kv / gate rows (rollback_step refolds
  // recorded rows through it).
  void emit_entries(int layer, const Batch& b, const TensorView& kv, const TensorView& gate, bool indexer);
  Tensor run_layers(const Batch& b);
  // The MTP layer on b's rows (ids: the next tokens; hidden f32 [N, hc, D]): e + h_proj(hnorm(h)) per stream, then
  // the block. Returns the block's output streams [N, hc, D].
  Tensor mtp_block(const Batch& b, const TensorView& hidden);
  // A sub-layer's hc_post not yet run: the next sub-layer's hc_pre runs it (ops::HcPreArgs::prev_*: on the GPU one
  // kernel and one read of the streams less a sub-layer), or flush() does. While one is pending, the streams
  // variable is empty: the pending inputs are the streams.
  struct PendingPost {
    Tensor streams, a, post, comb;
    bool on = false;  // (a batch of no tokens has empty tensors and may still be pending)
    bool set() const { return on; }
  };
  void flush(PendingPost& pending, Tensor& streams);
  // Whether the forward folds each hc_post into the next hc_pre: not under an observer (it sees every
  // sub-layer's streams), nor with paths().hc_fold off (A/B: the same bits either way).
  bool fold_hc_post() const;
  // streams [N, hc, D] through layer l, in place; with `pending`, the last hc_post is left pending there (and a
  // pending one from the layer before is taken first). Without an observer only: observers see every sub-layer's
  // streams as they were.
  void block(int l, const Batch& b, Tensor& streams, PendingPost* pending = nullptr);
  // logits = head(norm(hc_head(streams))) of the batch's wanted rows, with the trunk's hc_head and norm or the
  // MTP layer's.
  void head(const Batch& b, const Tensor& streams, const TensorView& logits, const HyperConnWeights& hc,
            const TensorView& norm);
  // The same of every row of streams [N, hc, D] (a recorded step's slots: a row's result is the same bits as when
  // gathered, every kernel here being per row); returns the logits [N, vocab] in the step's memory.
  Tensor head_of_every_row(const Tensor& streams, const HyperConnWeights& hc, const TensorView& norm);
  // Layer l's weights: a trunk layer, or the MTP block for l == mtp_layer().
  const LayerWeights& layer(int l) const {
    return l < w_.config.num_layers ? w_.layers.at(static_cast<size_t>(l)) : w_.mtp->block;
  }
  // Every layer's weights: the trunk's, then the MTP block's (when present).
  std::vector<LayerWeights*> all_layers();
  // q as wq_b wrote it: sparse_attention norms and rotates it at inv_freq (AttentionArgs::q_inv_freq) and rotates
  // the heads back; heads8 set: each sequence's heads quantised into its rows of heads8, not written to heads.
  void attend(int layer, const Batch& b, const Tensor& q, const Tensor& kv_rows,
              const std::vector<Tensor>& selected, const Tensor& heads, const ops::Fp8Rows* heads8,
              const TensorView& inv_freq);
  void attention_block(int layer, const Batch& b, const TensorView& h, const TensorView& out);
  // y_a = a x and y_b = b x, from one product when the pair is stacked (then a and b are column ranges of its
  // output: row-strided views, which the consumers take), else from two.
  struct Projections {
    Tensor stacked_out, a_out, b_out;  // the storage
    TensorView a, b;
  };
  Projections project(const TensorView& x, const ops::Weight& stacked, const ops::Weight& a,
                      const ops::Weight& b) const;
  void moe_block(int layer, const Batch& b, const TensorView& h, const TensorView& out);
  // The attention compressor's (or the indexer's) weights, its kv and gate projections of h, and the row
  // format its entries are stored in (indexer keys stay exact; attention rows follow the KV mode).
  struct CompressorInputs {
    const CompressorWeights* weights = nullptr;
    Projections kv_gate;  // kv = a, gate = b
    ops::KvRowFormat format;
  };
  CompressorInputs compressor_inputs(int layer, const TensorView& h, bool indexer);
  // The row format of a compressor's entries: indexer keys stay exact (f32), attention rows follow the KV mode.
  ops::KvRowFormat entry_format(const CompressorWeights& cw, bool indexer) const {
    return indexer ? ops::KvRowFormat{ops::KvFormat::f32, cw.width, w_.config.rope_dim} : kv_format();
  }
  // The per-sequence chunk path: each sequence not on the step tables (h, cq, q, kv_rows, heads: every row of the
  // step; the rows of sequences on the tables are left alone).
  void compress(int layer, const Batch& b, const TensorView& h, bool indexer);
  void indexer_select(int layer, const Batch& b, const TensorView& h, const TensorView& cq,
                      std::vector<Tensor>& selected);
  // The same for the rows on the step tables (h, cq, q, kv_rows, heads: rows 0 .. table_tokens - 1 of the step).
  void compress_step(int layer, const Batch& b, const TensorView& h, bool indexer);
  // The indexer's head weights of the tables' rows (weights_proj h: needs only h, so the branch computes it before cq
  // exists), then each slot's top-k from cq and them.
  Tensor indexer_weights(int layer, const TensorView& h);
  Tensor indexer_step(int layer, const Batch& b, const TensorView& h, const TensorView& cq, const TensorView& weights);
  // inv_freq (or empty): heads rotated back by the attention itself (ops::StepAttentionArgs::inv_freq).
  void attend_step(int layer, const Batch& b, const TensorView& q, const TensorView& kv_rows,
                   const Tensor& selected, const TensorView& heads, const TensorView& inv_freq);
  void check_state(const cache::SequenceState& state) const;
  template <typename Sublayer>
  void residual(const HyperConnWeights& hc, const TensorView& norm, const Batch& b, Tensor& streams,
                PendingPost* pending, const char* site, int layer, Sublayer&& sublayer);

  void observe(std::string_view name, int layer, const TensorView& t) const {
    if (observer_) observer_(name, layer, t);
  }

  // An intermediate of forward() on the model's device, from the context's memory (ops::Context::tensor): inside
  // a recorded step (DecodeGraphs) the step graphs' arena, explicitly; a device tensor made any other way while a
  // step is recorded is refused by the device's registered memory.
  // The forward's intermediates: every op writes its output whole, so on a device they are not zero-filled
  // (TERN_ACTIVATION_FILL=zero|poison fills them for A/B and diagnosis; tests check poison == zero).
  Tensor tensor(DType dtype, Shape shape) const {
    return ctx_.tensor(dtype, shape, device_, TensorInit::uninitialized);
  }
  // `host` itself on the host, else a device copy of it.
  Tensor on_device(Tensor host) const {
    return device_ == Device::cpu ? host : Tensor::copy_of(host, device_);
  }

  ModelWeights w_;
  KvMode mode_;
  ops::Activations act_ = ops::Activations::native;
  Device device_ = Device::cpu;
  ops::Context ctx_;
  static Paths default_paths();  // from the environment, read once
  Paths paths_ = default_paths();
  Observer observer_;
  Tensor inv_freq_main_, inv_freq_compress_;
  std::vector<cache::LayerSpec> layer_specs_;
  bool step_tables_ = true;
  StepPaths step_paths_;
  // Work for a side branch that the sub-layer places (residual's hc_comb: Paths::hc_comb_apart): attention_block
  // forks it after its first join, so it does not queue on the side stream ahead of the indexer's work (the branch
  // that the attention waits for); moe_block runs it in the shared expert's branch; residual runs what is left.
  std::function<void()> side_task_;
  std::function<void()> take_side_task() { return std::exchange(side_task_, nullptr); }
};

// Generation helpers for tests and `tern run`: prefill the prompt (in chunks of `chunk` tokens; 0 = all at
// once), then decode one token at a time. temperature <= 0 is greedy.
struct GenerateOptions {
  int64_t max_new_tokens = 32;
  float temperature = 0.0f;
  uint64_t seed = 0;
  int64_t prefill_chunk = 0;
  int64_t stop_token = -1;  // stop after emitting it (< 0: never)
  // Called after the prefill, before the first decode forward, and after the last decode forward, outside
  // the timed decode span (`tern run --profile` profiles the decode steps alone with them). May be empty.
  std::function<void()> before_decode, after_decode;
  // Runs the decode steps instead of model.forward when set (DecodeGraphs::forward, say).
  std::function<Tensor(std::span<const StepSequence>)> decode_forward;
  // MTP speculative decoding (issue #18; greedy only): each round drafts this many tokens (1..kMaxStepQueries - 1)
  // with the MTP layer (its first draft from the prompt's / last round's catch-up row, the rest chained), verifies
  // them with the pending token in one step of k + 1 tokens on the step tables, keeps the drafts the target's
  // greedy choices agree with and the target's next token. Rejected drafts are rolled back exactly (rollback_step:
  // the snapshot from before the verify, then the kept tokens' recorded rows and compressor inputs), and the MTP
  // window's rows of the chained drafts are put back. 0: plain decoding.
  int64_t speculative_tokens = 0;
  // Benchmarking only (the machinery without a trained draft): drafts forced to this continuation (the target's own
  // greedy tokens, from a plain run) where it reaches, each kept as it is with probability oracle_accept and
  // otherwise replaced by another token (so it is rejected). Empty: the MTP layer's drafts.
  std::vector<int64_t> draft_oracle;
  double oracle_accept = 1.0;
  // Tests: keep each round's first-draft logits in the result (first_draft_logits).
  bool keep_first_draft_logits = false;
};
struct GenerateResult {
  std::vector<int64_t> tokens;  // the generated tokens
  double prefill_seconds = 0, decode_seconds = 0;
  // Speculative decoding: verify steps, drafts proposed, drafts kept (acceptance length = (accepted + rounds) /
  // rounds: tokens per verify step).
  int64_t rounds = 0, drafts = 0, accepted = 0;
  // With keep_first_draft_logits, each round's first draft row: its position (m - 1) and the MTP layer's logits
  // there (tests: a clean catch-up over the same tokens gives the same bits when the window is rolled back right).
  std::vector<int64_t> first_draft_positions;
  std::vector<std::vector<float>> first_draft_logits;
};
GenerateResult generate(Model& model, cache::SequenceState& state, std::span<const int64_t> prompt,
                        const GenerateOptions& options);
std::vector<int64_t> greedy_generate(Model& model, std::span<const int64_t> prompt, int64_t max_new_tokens);

}  // namespace tern::model
