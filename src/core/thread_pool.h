// A fixed pool of worker threads for the CPU backend. parallel_for splits a range into one chunk per
// thread and blocks until all chunks are done; nested calls run inline (no deadlock, no oversubscription).
#pragma once

#include <cstdint>
#include <functional>

namespace tern {

// Number of threads used by parallel_for: TERN_THREADS if set, else the hardware concurrency.
int thread_count();
// Changes the pool size (tests and the --threads flag); 0 means the default.
void set_thread_count(int n);

// Calls fn(begin, end) on disjoint sub-ranges covering [begin, end), at most one per thread, each
// at least `grain` long.
void parallel_for(int64_t begin, int64_t end, const std::function<void(int64_t, int64_t)>& fn,
                  int64_t grain = 1);

}  // namespace tern
