// The only translation unit of tern_bench that includes Beast (it compiles slowly).
#include "bench/client.h"

#include <sys/socket.h>
#include <time.h>

#include <boost/asio.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>

#include "core/error.h"
#include "net/sse.h"

namespace tern::bench {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// A body that hands every decoded byte (after chunked framing) to a callback as it arrives.
struct SinkBody {
  struct value_type {
    std::function<void(std::string_view)> sink;
  };
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(http::header<isRequest, Fields>&, value_type& body) : body_(body) {}
    void init(const boost::optional<std::uint64_t>&, error_code& ec) { ec = {}; }
    template <class Buffers>
    std::size_t put(const Buffers& buffers, error_code& ec) {
      ec = {};
      std::size_t n = 0;
      for (auto b : boost::beast::buffers_range_ref(buffers)) {
        body_.sink(std::string_view(static_cast<const char*>(b.data()), b.size()));
        n += b.size();
      }
      return n;
    }
    void finish(error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

class Run;

// One request: connect, send, read the event stream, record times, finish exactly once.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Run& run, std::size_t index);
  void start();

 private:
  void on_connect(const error_code& ec);
  void wait_readable();
  void on_readable(const error_code& ec);
  void feed(const char* data, std::size_t n);
  void on_body(std::string_view bytes);
  void on_event(const std::string& data);
  bool check_header();
  void finish_at_eof();
  void fail(std::string reason, std::string message);
  void complete();
  double since_send(Clock::time_point t) const { return seconds(t - send_); }

  Run& run_;
  std::size_t index_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  std::string request_text_;
  http::response_parser<SinkBody> parser_;
  std::string pending_;          // bytes the HTTP parser has not taken yet
  net::SseParser sse_;
  std::vector<std::string> events_;
  std::string error_body_;       // body of a non-200 response (capped)
  Clock::time_point send_, arrival_, last_chunk_;
  bool header_checked_ = false, streaming_ = false, got_done_ = false, finished_ = false;
  bool has_first_ = false, kernel_stamp_ = false;
  RequestResult result_;
};

class Run {
 public:
  Run(const Target& target, const std::vector<RequestSpec>& requests, const RunOptions& options)
      : target_(target), requests_(requests), options_(options), progress_timer_(io_) {
    out_.results.resize(requests.size());
  }

  RunOutput execute() {
    resolve();
    t0_ = Clock::now();
    out_.t0 = t0_;
    schedule();
    tick_progress();
    io_.run();
    return std::move(out_);
  }

  // Called by a stream when it has finished, exactly once per request.
  void finished(std::size_t index, RequestResult result) {
    result.start_s += seconds(started_[index] - t0_);
    if (!result.success) ++progress_.failed;
    out_.results[index] = std::move(result);
    ++progress_.done;
    --progress_.in_flight;
    if (!waiting_.empty()) {
      std::size_t next = waiting_.front();
      waiting_.pop_front();
      // Posted, not called: a chain of instant failures must not recurse through the stack.
      asio::post(io_, [this, next] { launch(next); });
    }
    if (progress_.done == progress_.total) progress_timer_.cancel();
  }

  void record_chunk(Clock::time_point arrival, bool kernel) {
    ++progress_.content_chunks;
    out_.kernel_timestamps = kernel;
    if (out_.overhead_ms.size() < kMaxOverheadSamples)
      out_.overhead_ms.push_back(static_cast<float>(seconds(Clock::now() - arrival) * 1e3));
  }

  asio::io_context& io() { return io_; }
  const Target& target() const { return target_; }
  const RequestSpec& request(std::size_t i) const { return requests_[i]; }
  const tcp::resolver::results_type& endpoints() const { return endpoints_; }
  const std::string& resolve_error() const { return resolve_error_; }
  bool tag_requests() const { return options_.tag_requests; }
  char* read_buffer() { return read_buffer_.data(); }
  std::size_t read_buffer_size() const { return read_buffer_.size(); }

 private:
  static constexpr std::size_t kMaxOverheadSamples = 4'000'000;

  // Resolved once; a failure fails every request with reason "resolve" instead of aborting.
  void resolve() {
    error_code ec;
    tcp::resolver resolver(io_);
    endpoints_ = resolver.resolve(target_.host, target_.port, ec);
    if (ec) resolve_error_ = cat("cannot resolve ", target_.host, ":", target_.port, ": ", ec.message());
  }

  void schedule() {
    progress_.total = static_cast<int>(requests_.size());
    started_.resize(requests_.size());
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      double offset = i < options_.offsets.size() ? options_.offsets[i] : 0.0;
      if (offset <= 0) {
        arrive(i);
        continue;
      }
      auto timer = std::make_shared<asio::steady_timer>(
          io_, t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(offset)));
      timer->async_wait([this, i, timer](const error_code&) { arrive(i); });
    }
  }

  // --max-concurrency queues an arrived request without moving later arrivals.
  void arrive(std::size_t i) {
    if (options_.max_concurrency > 0 && progress_.in_flight >= options_.max_concurrency) waiting_.push_back(i);
    else launch(i);
  }

  void launch(std::size_t i) {
    ++progress_.in_flight;
    started_[i] = Clock::now();
    std::make_shared<Stream>(*this, i)->start();
  }

  void tick_progress() {
    if (!options_.on_progress || progress_.done == progress_.total) return;
    progress_.elapsed_s = seconds(Clock::now() - t0_);
    options_.on_progress(progress_);
    progress_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.progress_interval_s)));
    progress_timer_.async_wait([this](const error_code& ec) {
      if (!ec) tick_progress();
      else if (options_.on_progress) options_.on_progress(progress_);
    });
  }

  const Target& target_;
  const std::vector<RequestSpec>& requests_;
  const RunOptions& options_;
  asio::io_context io_{1};
  asio::steady_timer progress_timer_;
  tcp::resolver::results_type endpoints_;
  std::string resolve_error_;
  Clock::time_point t0_;
  std::vector<Clock::time_point> started_;
  std::deque<std::size_t> waiting_;
  Progress progress_;
  RunOutput out_;
  std::vector<char> read_buffer_ = std::vector<char>(1 << 16);  // shared: the loop is single-threaded
};

Stream::Stream(Run& run, std::size_t index)
    : run_(run), index_(index), socket_(run.io()), deadline_(run.io()) {
  parser_.body_limit(boost::none);
  parser_.eager(true);
  parser_.get().body().sink = [this](std::string_view bytes) { on_body(bytes); };
  const RequestSpec& req = run.request(index);
  result_.input_len = req.input_len;
  result_.output_len = req.output_len;
}

void Stream::start() {
  // The clock starts before connecting, as in sglang and vLLM (one new connection per request).
  send_ = Clock::now();
  if (!run_.resolve_error().empty()) {
    asio::post(run_.io(), [self = shared_from_this()] { self->fail("resolve", self->run_.resolve_error()); });
    return;
  }
  std::string user = run_.tag_requests() ? cat("tern-bench-", index_) : std::string();
  try {
    request_text_ = http_request(run_.target(), request_body(run_.target(), run_.request(index_), user));
  } catch (const Error& e) {
    std::string what = e.what();
    asio::post(run_.io(), [self = shared_from_this(), what] { self->fail("request", what); });
    return;
  }
  deadline_.expires_after(std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(run_.target().timeout_s)));
  deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec || self->finished_) return;
    self->fail("timeout", cat("no complete response within ", self->run_.target().timeout_s, " s (",
                              self->result_.itl_s.size() + (self->has_first_ ? 1 : 0),
                              " content chunks received)"));
  });
  asio::async_connect(socket_, run_.endpoints(),
                      [self = shared_from_this()](const error_code& ec, const tcp::endpoint&) {
                        self->on_connect(ec);
                      });
}

void Stream::on_connect(const error_code& ec) {
  if (finished_) return;
  if (ec) return fail("connect", cat("cannot connect to ", run_.target().host, ":", run_.target().port, ": ",
                                     ec.message()));
  error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);
  int on = 1;
  ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
  socket_.non_blocking(true, ignored);
  asio::async_write(socket_, asio::buffer(request_text_), [self = shared_from_this()](const error_code& ec, std::size_t) {
    if (ec && !self->finished_) self->fail("send", cat("sending the request failed: ", ec.message()));
  });
  wait_readable();
}

void Stream::wait_readable() {
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
    self->on_readable(ec);
  });
}

// Reads with recvmsg to get the kernel's receive timestamp of the data (SCM_TIMESTAMPNS).
void Stream::on_readable(const error_code& ec) {
  if (finished_) return;
  if (ec) return fail("disconnected", cat("waiting for the response failed: ", ec.message()));
  while (!finished_) {
    iovec iov{run_.read_buffer(), run_.read_buffer_size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = ::recvmsg(socket_.native_handle(), &msg, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return wait_readable();
    if (n < 0) return fail("disconnected", cat("reading the response failed: ", std::strerror(errno)));
    if (n == 0) return finish_at_eof();
    Clock::time_point now = Clock::now();
    arrival_ = now;
    bool kernel = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof ts);
      std::int64_t age_ns = realtime_ns() - (std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
      if (age_ns >= 0) arrival_ = now - std::chrono::nanoseconds(age_ns), kernel = true;
    }
    kernel_stamp_ = kernel;
    feed(run_.read_buffer(), static_cast<std::size_t>(n));
  }
}

void Stream::feed(const char* data, std::size_t n) {
  pending_.append(data, n);
  while (!pending_.empty() && !finished_ && !got_done_) {
    error_code ec;
    std::size_t used = parser_.put(asio::buffer(pending_), ec);
    pending_.erase(0, used);
    if (ec == http::error::need_more) break;
    if (ec) return fail("bad response", cat("malformed HTTP response: ", ec.message()));
    if (parser_.is_done()) break;
  }
  if (finished_) return;
  if (!header_checked_ && parser_.is_header_done()) check_header();
  if (got_done_ || parser_.is_done()) finish_at_eof();
}

bool Stream::check_header() {
  header_checked_ = true;
  const auto& head = parser_.get();
  auto type = head[http::field::content_type];
  streaming_ = head.result_int() == 200 && type.find("text/event-stream") != boost::string_view::npos;
  return streaming_;
}

void Stream::on_body(std::string_view bytes) {
  if (!header_checked_) check_header();
  if (!streaming_) {
    constexpr std::size_t kKeep = 2048;  // enough for an error message, bounded for a huge body
    if (error_body_.size() < kKeep) error_body_.append(bytes.substr(0, kKeep - error_body_.size()));
    return;
  }
  events_.clear();
  sse_.feed(bytes, events_);
  for (const auto& e : events_) {
    if (finished_ || got_done_) break;
    on_event(e);
  }
}

void Stream::on_event(const std::string& data) {
  ChunkInfo info = read_chunk(data, run_.target().api);
  if (!info.error.empty()) return fail(info.malformed ? "malformed SSE" : "server error", info.error);
  if (info.completion_tokens) result_.output_len = *info.completion_tokens, result_.usage_reported = true;
  if (info.prompt_tokens) result_.input_len = *info.prompt_tokens;
  if (info.has_content) {
    if (!has_first_) result_.ttft_s = since_send(arrival_), has_first_ = true;
    else result_.itl_s.push_back(seconds(arrival_ - last_chunk_));
    last_chunk_ = arrival_;
    run_.record_chunk(arrival_, kernel_stamp_);
  }
  result_.latency_s = since_send(arrival_);
  got_done_ = info.done;
}

// The message of an OpenAI-shaped error body, else the start of the body.
std::string error_text(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    return e.is_object() ? e.value("message", e.dump()) : e.dump();
  }
  return body.substr(0, 300);
}

void Stream::finish_at_eof() {
  if (finished_) return;
  if (!parser_.is_header_done()) return fail("disconnected", "connection closed before a response header");
  if (!header_checked_) check_header();
  const auto& head = parser_.get();
  if (head.result_int() != 200)
    return fail(cat("http ", head.result_int()), cat("HTTP ", head.result_int(), ": ", error_text(error_body_)));
  if (!streaming_)
    return fail("not a stream", cat("HTTP 200 with Content-Type '", head[http::field::content_type],
                                   "' instead of text/event-stream"));
  if (!got_done_) {
    if (auto last = sse_.flush()) on_event(*last);
    if (finished_) return;
    if (!got_done_) return fail("incomplete stream", "the stream ended before data: [DONE]");
  }
  if (!has_first_) return fail("no content", "the stream carried no content chunk");
  result_.success = true;
  complete();
}

void Stream::fail(std::string reason, std::string message) {
  if (finished_) return;
  result_.success = false;
  result_.reason = std::move(reason);
  result_.error = std::move(message);
  complete();
}

void Stream::complete() {
  finished_ = true;
  deadline_.cancel();
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  result_.start_s = 0;  // Run adds the send time relative to the run's start
  result_.latency_s = result_.success ? result_.latency_s : since_send(Clock::now());
  run_.finished(index_, std::move(result_));
}

}  // namespace

RunOutput run_requests(const Target& target, const std::vector<RequestSpec>& requests, const RunOptions& options) {
  Run run(target, requests, options);
  return run.execute();
}

}  // namespace tern::bench
