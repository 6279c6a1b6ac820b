// `tern serve`'s assembly (the verb in tools/verbs/serve.cpp binds these options to its command line): the
// model loaded or built on its device, the engine, the OpenAI service on the HTTP front, the PD transfer side,
// the warm-up, and the drain on SIGTERM / SIGINT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/device.h"
#include "net/http_options.h"

namespace tern::app {

struct ServeOptions {
  std::string model, tokenizer, host = "127.0.0.1", served_name, api_key, state_memory = "0.1", kv_mode = "auto";
  std::string device = "cpu", cuda_graphs = "on", sampling = "device";
  TuneOptions tune;
  bool no_cuda_graphs = false;
  // --synthetic: random weights built in place on the device (docs/bench-step.md), no checkpoint
  bool synthetic = false;
  std::string synthetic_config = "full", experts = "mxfp4";
  double synthetic_headroom_gib = 16;
  int64_t cuda_graph_max_batch = 0;
  int port = 8000;
  int threads = 0;
  int max_running = 256;
  int profile_steps = 0;  // --profile-steps: GPU profiles of the first steps with a prompt chunk
  int64_t token_budget = 2048, max_chunk = 2048, max_model_len = 0;
  double request_timeout_s = 600, drain_timeout_s = 30;
  net::HttpOptions http;
  // MTP speculative decoding (docs/mtp.md): off, mtp (at every batch size) or auto (while at most the measured
  // threshold's sequences decode); --speculative-max-batch overrides the threshold (0: every batch size); the oracle
  // acceptance is for benchmarks only (the output is not the model's).
  std::string speculative = "off";
  int num_speculative_tokens = 3;
  int64_t speculative_max_batch = -1;  // -1: auto's stored measurement, mtp's every batch size
  double speculative_oracle_accept = -1;
  // admission (docs/serving.md, "Limits")
  int64_t max_request_tokens = 0, max_client_tokens = 0;  // 0: what the state memory holds
  std::vector<std::string> forwarded_allow_ips;
  // prefill-decode disaggregation (docs/disaggregation.md)
  std::string role = "both", pd_host, pd_backend = "tcp";
  int pd_port = 0;
  double pd_heartbeat_s = 1, pd_peer_timeout_s = 10, pd_rendezvous_timeout_s = 30, pd_transfer_timeout_s = 30;
};

// Serves until a signal drains it; returns the exit code. Throws (before listening where it can) naming a bad
// option or what could not be loaded.
int serve(const ServeOptions& a);

}  // namespace tern::app
