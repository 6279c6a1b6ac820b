#include "server/metrics_text.h"

#include <fmt/format.h>

#include "engine/request.h"
#include "net/prometheus.h"

namespace tern::server {

using net::prom_header;
using net::prom_histogram;
using net::prom_histogram_series;
using net::prom_scalar;

std::string render_metrics(const engine::EngineMetrics& m, const ServerCounters& s, const std::string& model) {
  const std::string l = fmt::format("model_name=\"{}\"", model);
  std::string out;
  prom_scalar(out, "num_requests_running", "gauge", "Requests with state in the engine.", double(m.num_running), l);
  prom_scalar(out, "num_requests_waiting", "gauge", "Requests waiting for admission.", double(m.num_waiting), l);
  prom_scalar(out, "num_requests_transferring", "gauge", "Requests holding reserved state memory while their state arrives.",
         double(m.num_transferring), l);
  prom_scalar(out, "state_memory_used_bytes", "gauge", "Sequence state memory in use (pages).", double(m.state_used_bytes), l);
  prom_scalar(out, "state_memory_total_bytes", "gauge", "Sequence state memory budget.", double(m.state_total_bytes), l);
  prom_scalar(out, "state_memory_usage_perc", "gauge", "Fraction of the state memory in use.",
         m.state_total_bytes ? double(m.state_used_bytes) / double(m.state_total_bytes) : 0.0, l);
  prom_scalar(out, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.", double(m.prompt_tokens_total), l);
  prom_scalar(out, "generation_tokens_total", "counter", "Generated tokens of finished requests.",
         double(m.generation_tokens_total), l);
  prom_scalar(out, "num_preemptions_total", "counter", "Requests preempted (state recomputed later).",
         double(m.preemptions_total), l);
  prom_scalar(out, "engine_steps_total", "counter", "Engine steps that ran the model.", double(m.steps_total), l);
  prom_header(out, "request_success_total", "counter", "Finished requests by finish reason.");
  for (auto r : {engine::FinishReason::stop, engine::FinishReason::length, engine::FinishReason::abort,
                 engine::FinishReason::error, engine::FinishReason::handover})
    out += fmt::format("tern:request_success_total{{{},finished_reason=\"{}\"}} {}\n", l, engine::finish_reason_name(r),
                       m.finished_total[static_cast<size_t>(r)]);
  prom_histogram(out, "time_to_first_token_seconds", "Time to the first generated token.", m.time_to_first_token_seconds, l);
  prom_histogram(out, "inter_token_latency_seconds", "Time between generated tokens.", m.inter_token_latency_seconds, l);
  prom_histogram(out, "e2e_request_latency_seconds", "Request latency from arrival to finish.", m.e2e_request_latency_seconds, l);
  prom_histogram(out, "batch_size", "Sequences per engine step.", m.batch_size, l);
  prom_histogram(out, "step_seconds", "Duration of an engine step.", m.step_seconds, l);
  prom_histogram(out, "model_forward_seconds", "The model's part of a step.", m.forward_seconds, l);
  prom_histogram(out, "sample_seconds", "Sampling and delivery part of a step.", m.sample_seconds, l);
  prom_scalar(out, "cuda_graph_replays_total", "counter", "Steps replayed from a CUDA graph.",
         double(m.step_paths.graph_steps), l);
  uint64_t eager = 0;
  for (const auto& [reason, n] : m.step_paths.eager_steps) eager += n;
  prom_scalar(out, "eager_steps_total", "counter", "Steps run eagerly (not from a CUDA graph).", double(eager), l);
  const auto by_reason = [&](const char* name, const char* help, const std::map<std::string, uint64_t>& counts) {
    prom_header(out, name, "counter", help);
    for (const auto& [reason, n] : counts) {
      std::string r;
      for (char ch : reason) r += ch == '"' || ch == '\\' ? '\'' : ch == '\n' ? ' ' : ch;
      out += fmt::format("tern:{}{{{},reason=\"{}\"}} {}\n", name, l, r, n);
    }
  };
  by_reason("eager_steps_by_reason_total", "Steps run eagerly, by why they could not replay a graph.",
            m.step_paths.eager_steps);
  // Speculative decoding's MTP rows (drafting rounds and catch-ups), not engine steps.
  prom_scalar(out, "spec_decode_mtp_graph_replays_total", "counter",
              "MTP rows (drafting rounds, catch-ups) replayed from a CUDA graph.", double(m.step_paths.mtp_graph_steps), l);
  by_reason("spec_decode_mtp_eager_total", "MTP rows (drafting rounds, catch-ups) run eagerly, by why.",
            m.step_paths.mtp_eager_steps);
  prom_header(out, "eager_step_tokens_total", "counter",
              "Tokens of eager steps by where their attention, compressor and indexer ran: step_tables (one launch "
              "per op for all of them) or per_sequence (prefill chunks).");
  out += fmt::format("tern:eager_step_tokens_total{{{},path=\"step_tables\"}} {}\n", l, m.step_paths.table_tokens);
  out += fmt::format("tern:eager_step_tokens_total{{{},path=\"per_sequence\"}} {}\n", l,
                     m.step_paths.per_sequence_tokens);
  prom_scalar(out, "mixed_steps_total", "counter",
              "Eager steps with prefill chunks per sequence beside tokens on the step tables.",
              double(m.step_paths.mixed_steps), l);
  // Speculative decoding, vLLM's counters (zero, not omitted, when off; per position only when on).
  prom_scalar(out, "spec_decode_num_drafts_total", "counter", "Verify rounds: one per sequence per step that drafted.",
              double(m.spec_drafts_total), l);
  prom_scalar(out, "spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.",
              double(m.spec_draft_tokens_total), l);
  prom_scalar(out, "spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
              double(m.spec_accepted_tokens_total), l);
  if (!m.spec_accepted_per_position.empty()) {
    prom_header(out, "spec_decode_num_accepted_tokens_per_pos_total", "counter", "Draft tokens accepted, by draft position.");
    for (size_t i = 0; i < m.spec_accepted_per_position.size(); ++i)
      out += fmt::format("tern:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", l, i,
                         m.spec_accepted_per_position[i]);
  }
  prom_scalar(out, "http_requests_total", "counter", "HTTP requests received.", double(s.http_requests_total), l);
  prom_scalar(out, "http_client_errors_total", "counter", "HTTP 4xx answers.", double(s.http_errors_4xx_total), l);
  prom_scalar(out, "http_server_errors_total", "counter", "HTTP 5xx answers.", double(s.http_errors_5xx_total), l);
  prom_scalar(out, "client_disconnects_total", "counter", "Requests aborted by a client disconnect.",
         double(s.client_disconnects_total), l);
  prom_scalar(out, "request_timeouts_total", "counter", "Requests aborted by the per-request timeout.",
         double(s.request_timeouts_total), l);
  out += net::render_http_metrics(s.http, l);
  prom_scalar(out, "admission_clients", "gauge", "Clients with tokens of state in flight.", double(s.admission_clients), l);
  return out;
}

std::string render_pd_metrics(const transfer::PdMetrics& m, const char* side, const std::string& model) {
  const std::string l = fmt::format("model_name=\"{}\",side=\"{}\"", model, side);
  std::string out;
  prom_scalar(out, "pd_transfers_total", "counter", "State transfers that completed.", double(m.transfers_ok), l);
  prom_header(out, "pd_transfers_failed_total", "counter", "State transfers that failed, by reason.");
  for (size_t r = 0; r < m.failed.size(); ++r)
    out += fmt::format("tern:pd_transfers_failed_total{{{},reason=\"{}\"}} {}\n", l,
                       transfer::fail_reason_name(static_cast<transfer::FailReason>(r)), m.failed[r]);
  prom_scalar(out, "pd_transfer_bytes_total", "counter", "State bytes moved.", double(m.bytes), l);
  prom_scalar(out, "pd_transfers_in_progress", "gauge", "Transfers (rooms) in progress.", double(m.rooms), l);
  prom_scalar(out, "pd_landing_bytes", "gauge", "Landing memory held for states on their way.", double(m.landed_bytes), l);
  prom_histogram(out, "pd_transfer_seconds", "Offer to ack (prefill side), ready to import (decode side).", m.seconds, l);
  prom_header(out, "pd_phase_seconds", "histogram",
              "Decode side, per completed transfer: connect, handshake, prefill (until the offer), transfer, import.");
  for (size_t i = 0; i < m.phases.size(); ++i)
    prom_histogram_series(out, "pd_phase_seconds", m.phases[i],
                          fmt::format("{},phase=\"{}\"", l, transfer::pd_phase_name(static_cast<transfer::PdPhase>(i))));
  return out;
}

}  // namespace tern::server
