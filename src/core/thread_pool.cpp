#include "core/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/env.h"

namespace tern {
namespace {

thread_local bool tls_in_worker = false;

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int chunks, const std::function<void(int)>& task) {
    std::unique_lock lock(mu_);
    task_ = &task;
    next_ = 1;  // chunk 0 runs on the calling thread
    chunks_ = chunks;
    pending_ = chunks - 1;
    error_ = nullptr;
    ++generation_;
    lock.unlock();
    cv_.notify_all();
    run_chunk(0);
    lock.lock();
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run_chunk(int i) {
    tls_in_worker = true;
    try {
      (*task_)(i);
    } catch (...) {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    tls_in_worker = false;
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_ < chunks_); });
      if (stop_) return;
      seen = generation_;
      while (next_ < chunks_) {
        const int i = next_++;
        lock.unlock();
        run_chunk(i);
        lock.lock();
        if (--pending_ == 0) done_cv_.notify_all();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int next_ = 0, chunks_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

int default_threads() {
  // TERN_THREADS: the pool's threads; unset: one a hardware thread.
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(env_int("TERN_THREADS", hardware, 1, 1 << 16));
}

std::mutex g_pool_mu;
std::unique_ptr<Pool> g_pool;

Pool& pool() {
  std::lock_guard lock(g_pool_mu);
  if (!g_pool) g_pool = std::make_unique<Pool>(default_threads());
  return *g_pool;
}

}  // namespace

int thread_count() { return pool().size(); }

void set_thread_count(int n) {
  std::lock_guard lock(g_pool_mu);
  g_pool = std::make_unique<Pool>(n > 0 ? n : default_threads());
}

void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  Pool& p = pool();
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  const int chunks = static_cast<int>(std::min<int64_t>(p.size(), max_chunks));
  if (chunks <= 1 || tls_in_worker) {
    fn(begin, end);
    return;
  }
  // One pool job at a time: concurrent callers (several engine threads) serialise here.
  static std::mutex run_mu;
  std::lock_guard lock(run_mu);
  p.run(chunks, [&](int i) {
    const int64_t lo = begin + n * i / chunks, hi = begin + n * (i + 1) / chunks;
    fn(lo, hi);
  });
}

}  // namespace tern
