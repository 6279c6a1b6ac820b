#include "app/profiled_runner.h"

#include <algorithm>
#include <chrono>

#include "app/measure.h"
#include "core/error.h"
#include "core/log.h"

namespace tern::app {

ProfiledRunner::ProfiledRunner(std::shared_ptr<engine::ModelRunner> inner, const std::string& device, int steps,
                               int layers)
    : inner_(std::move(inner)), profiler_(std::make_unique<StepProfiler>(device)), left_(2 * steps), timed_(steps),
      layers_(layers) {
  TERN_CHECK(steps > 0, "--profile-steps must be positive, found ", steps);
}

ProfiledRunner::~ProfiledRunner() = default;

template <class Fn>
void ProfiledRunner::run(const engine::StepBatch& batch, Fn&& fn) {
  int64_t prompt_tokens = 0, largest = 0, decodes = 0;
  for (const auto& c : batch.chunks) {
    if (c.count > 1) {
      prompt_tokens += c.count;
      largest = std::max<int64_t>(largest, c.count);
    } else {
      ++decodes;
    }
  }
  ++seen_;
  if (left_ <= 0 || prompt_tokens == 0) {
    fn();
    return;
  }
  --left_;
  const bool profile = left_ >= timed_;  // the first N profiled, the next N timed only (the profiler's own cost)
  const std::string what = cat("server step ", seen_, ": ", batch.chunks.size(), " sequences, ", prompt_tokens,
                               " prompt tokens (largest chunk ", largest, "), ", decodes, " decode tokens");
  if (profile) profiler_->start();
  const auto t0 = std::chrono::steady_clock::now();
  fn();  // returns once the results are on the host: the device is done
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (profile) log::info("profile of ", what, ": ", ms, " ms wall\n", profiler_->stop(1, what, layers_));
  else log::info("timed (not profiled) ", what, ": ", ms, " ms wall");
}

void ProfiledRunner::forward(const engine::StepBatch& batch, std::span<float> logits) {
  run(batch, [&] { inner_->forward(batch, logits); });
}

void ProfiledRunner::forward_sample(const engine::StepBatch& batch, std::span<const engine::SampleRequest> requests,
                                    std::span<engine::SampleResult> results, std::span<float> host_logits) {
  run(batch, [&] { inner_->forward_sample(batch, requests, results, host_logits); });
}

}  // namespace tern::app
