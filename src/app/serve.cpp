#include "app/serve.h"

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
#include "app/embedded_model.h"
#include "app/pd_transfer.h"
#include "app/profiled_runner.h"
#include "app/speculative_threshold.h"
#include "app/synthetic_placement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/decode_graphs.h"
#include "engine/engine.h"
#include "engine/v4_runner.h"
#include "model/v4_model.h"
#include "model/weights.h"
#include "net/http.h"
#include "server/pd_jobs.h"
#include "server/service.h"
#include "server/text_codec.h"
#include "tokenizer/locate.h"
#include "transfer/decode_rooms.h"
#include "transfer/prefill_rooms.h"

namespace tern::app {

namespace {

namespace fs = std::filesystem;

// "512M", "2G", "1048576" (bytes) or a fraction of the free memory where the states live ("0.25").
int64_t parse_memory(const std::string& s, const std::string& device) {
  TERN_CHECK(!s.empty(), "--state-memory is empty");
  size_t used = 0;
  const double v = std::stod(s, &used);
  const std::string suffix = s.substr(used);
  if (suffix.empty() && v > 0 && v < 1)
    return static_cast<int64_t>(v * static_cast<double>(free_state_memory(device)));
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

// --speculative auto: the measured threshold (app/speculative_threshold.h) unless --speculative-max-batch gives one;
// mtp: every batch size unless given. Logs the value and where it came from.
int64_t resolve_speculative_max_batch(const ServeOptions& a, const model::Model& m) {
  const int k = a.num_speculative_tokens;
  if (a.speculative_max_batch >= 0) {
    log::info("speculative decoding: MTP, ", k, " drafts a round, while at most ", a.speculative_max_batch,
              " sequences decode (--speculative-max-batch", a.speculative_max_batch == 0 ? "; 0: every batch size)" : ")");
    return a.speculative_max_batch;
  }
  if (a.speculative == "mtp") {
    log::info("speculative decoding: MTP, ", k, " drafts a round, at every batch size (--speculative mtp)");
    return 0;
  }
  const std::string device = speculative_device_key(a.device), path = speculative_threshold_path();
  const std::string key = speculative_model_key(m);
  const auto t = load_speculative_threshold(device, key, k, path);
  TERN_CHECK(t.has_value(), "--speculative auto: no measured threshold for ", k, " drafts on ", device, " with ", key,
             " in ", path, ": measure it with `tern bench-step --speculative ", k,
             " --save-speculative-threshold` (same model shape) or give --speculative-max-batch N");
  TERN_CHECK(t->max_batch > 0, "--speculative auto: the measurement in ", path, " (", t->measured, ") found that ", k,
             " drafts never pay on ", device, " at acceptance length ", t->acceptance_length,
             " and a least gain of ", t->min_gain, "x; use --speculative off, or force it with --speculative-max-batch N");
  log::info("speculative decoding: MTP, ", k, " drafts a round, while at most ", t->max_batch,
            " sequences decode (--speculative auto: measured ", t->measured, " at acceptance length ",
            t->acceptance_length, " and a least gain of ", t->min_gain, "x, from ", path, ")");
  return t->max_batch;
}

struct Loaded {
  std::shared_ptr<engine::Engine> engine;
  std::unique_ptr<server::TextCodec> codec;
  Placement placed;  // keeps the device weights alive
  std::string name;
  int64_t max_model_len = 0;
};

Loaded load(const ServeOptions& a) {
  TERN_CHECK(!a.synthetic || a.model.empty(), "--synthetic serves random weights: it takes no --model");
  const std::string dir = a.synthetic ? std::string() : a.model.empty() ? embedded_model_dir() : a.model;
  const std::string tok = tokenizer::locate_tokenizer(tokenizer::TokenizerSearch::from_environment(a.tokenizer, dir));
  Loaded l;
  l.codec = server::make_tokenizer_codec(tok);
  prepare_device(a.device);
  std::string kv_note;
  const model::KvMode kv = parse_kv_mode(a.kv_mode, a.device, &kv_note);
  log::info(kv_note);
  std::shared_ptr<model::Model> m;
  int64_t weight_bytes = 0;
  std::string source;
  if (a.synthetic) {
    model::WeightFormat experts{};
    TERN_CHECK(model::parse_expert_format(a.experts, &experts) && experts != model::WeightFormat::f32,
               "--experts: expected mxfp4, nvfp4 or bf16, found \"", a.experts, "\"");
    const auto reserve = static_cast<int64_t>(a.synthetic_headroom_gib * (1 << 30));
    SyntheticPlacement sp = place_synthetic_model(synthetic_config(a.synthetic_config), experts, kv,
                                                  a.device, a.device == "cpu" ? 0 : reserve, 1);
    m = sp.model;
    weight_bytes = static_cast<int64_t>(sp.sharing.stored_bytes);
    source = "--synthetic " + a.synthetic_config;
    l.placed.device = a.device;
    l.placed.weight_bytes = a.device == "cpu" ? 0 : weight_bytes;
    l.placed.description = sp.description;
  } else {
    auto weights = model::load_model(dir);
    m = std::make_shared<model::Model>(std::move(weights), kv, device_context("cpu"));
    l.placed = place_model(*m, a.device);
    weight_bytes = checkpoint_bytes(dir);
    source = dir;
  }
  for (const auto& line : configure_kernels(*m, a.device, a.tune)) log::info(line);
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
  TERN_CHECK(a.speculative == "off" || a.speculative == "mtp" || a.speculative == "auto",
             "--speculative: expected off, mtp or auto, found \"", a.speculative, "\"");
  const bool speculate = a.speculative != "off";
  TERN_CHECK(speculate || (a.speculative_max_batch < 0 && a.speculative_oracle_accept < 0),
             "--speculative-max-batch and --speculative-oracle-accept need --speculative mtp or auto");
  engine::DecodeGraphOptions graphs;
  graphs.enabled = a.cuda_graphs == "on" && !a.no_cuda_graphs;
  if (speculate)  // verify steps replay graphs too (a k out of range is refused by enable_speculative, below)
    graphs.max_queries = std::clamp<int64_t>(a.num_speculative_tokens + 1, 1, model::Model::kMaxStepQueries);
  graphs.max_batch = a.cuda_graph_max_batch > 0 ? a.cuda_graph_max_batch : std::min(a.max_running, 128);
  runner->enable_decode_graphs(graphs);  // records the decode buckets now (startup), or logs why not
  TERN_CHECK(a.sampling == "device" || a.sampling == "host", "--sampling: expected device or host, found \"",
             a.sampling, "\"");
  runner->set_device_sampling(a.sampling == "device");  // a CPU model samples on the host either way
  int64_t speculative_max_batch = 0;
  if (speculate) {
    // The rollback memory of every running sequence is taken now, before the state budget: the batch never shrinks.
    runner->enable_speculative(a.num_speculative_tokens, a.max_running);
    speculative_max_batch = resolve_speculative_max_batch(a, *m);
  }
  if (a.device != "cpu") {
    // The largest step's activations and library scratch are reserved before the state budget is taken
    // from what is free, so a fraction like 0.8 leaves room for a full token budget's step.
    const int64_t step_tokens = std::min<int64_t>(a.token_budget, l.max_model_len);
    const int64_t free_before = free_state_memory(a.device);
    runner->reserve_step_memory(step_tokens);
    const int64_t free_after = free_state_memory(a.device);
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
  o.speculative_max_batch = static_cast<int>(std::min<int64_t>(speculative_max_batch, a.max_running));
  o.oracle_accept = a.speculative_oracle_accept;
  if (a.speculative_oracle_accept >= 0)
    log::warn("--speculative-oracle-accept ", a.speculative_oracle_accept, ": BENCHMARK MODE, drafts are kept by chance "
              "and emitted: the output is not the model's");
  std::shared_ptr<engine::ModelRunner> stepper = runner;
  if (a.profile_steps > 0)
    stepper = std::make_shared<ProfiledRunner>(runner, a.device, a.profile_steps, config.num_layers);
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
server::AdmissionLimits admission_limits(const ServeOptions& a, const engine::Engine& engine) {
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

transfer::PdOptions pd_options(const ServeOptions& a) {
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

  void bind(const ServeOptions& a, net::HttpServer& http) {
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
  std::unique_ptr<transfer::Backend> make_backend(const ServeOptions& a, const std::string& host, net::HttpServer& http) {
    PdBackendChoice c;
    c.name = a.pd_backend;
    c.device = a.device;
    c.bind_host = host;
    c.port = static_cast<uint16_t>(a.pd_port);
    c.listen = context.role == server::Role::decode;
    return make_pd_backend(c, options, http.io_context());
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

int run_serve(const ServeOptions& a) {
  set_allocator_policy();
  if (a.threads > 0) set_thread_count(a.threads);
  TERN_CHECK(a.port >= 0 && a.port <= 65535, "--port: expected 0 to 65535, found ", a.port);
  std::shared_ptr<server::ApiService> service;  // touched on the IO thread only
  Drain drain;
  const net::ApiError loading(503, "the model is loading", "", "unavailable");
  net::HttpServer http(
      a.host, static_cast<uint16_t>(a.port), net::http_limits(a.http, a.role == "both" ? 1 : 3),
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
    if (a.device != "cpu") log::info("device memory after the warm-up step: ", device_memory_report(l.placed));
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

}  // namespace

int serve(const ServeOptions& a) { return run_serve(a); }

}  // namespace tern::app
