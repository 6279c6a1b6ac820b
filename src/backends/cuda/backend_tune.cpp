// Tuning the streaming linear kernel's K groups per weight shape (cuda_backend.h, tune_linears).
#include <algorithm>
#include <chrono>
#include <map>

#include "backends/cuda/backend_impl.h"
#include "backends/cuda/timing.h"
#include "core/error.h"

namespace tern::cuda {
namespace {

constexpr int64_t kTuneTokens[] = {1, 16, 64};  // decode batch sizes the choice is measured at
constexpr size_t kBeyondL2 = size_t{256} << 20;  // weight copies cycled per measurement: more than L2 holds
constexpr int kMaxCopies = 64;

// One token of `w` (the plan's K groups depend on the weight alone).
LinearParams params_of(const CudaBackend::Impl& impl, const ops::Weight& w, int64_t groups) {
  LinearParams p;
  p.w = device_mat(w);
  p.T = 1;
  p.x_stride = groups * w.in;
  p.rows_per_group = w.out / groups;
  p.num_sms = impl.num_sms;
  return p;
}

std::string tune_key(const ops::Weight& w, int64_t groups) {
  return cat(kLinearStreamTuneVersion, "/", ops::weight_format_name(w.format), "/out=", w.out, "/in=", w.in,
             "/rows=", w.out / groups);
}

}  // namespace

std::string CudaBackend::tune_device() const {
  int dev = 0;
  TERN_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  TERN_CUDA(cudaGetDeviceProperties(&prop, dev));
  return cat(prop.name, "|sm_", prop.major, prop.minor, "|", prop.multiProcessorCount, " SMs");
}

void CudaBackend::set_linear_groups(const ops::Weight& w, int groups) {
  const void* key = device_mat(w).w;
  if (groups > 0) {
    impl_->linear_groups[key] = groups;
  } else {
    impl_->linear_groups.erase(key);
    impl_->linear_ran.erase(key);  // a fresh start for this weight (its memory may be reused)
  }
}

CudaBackend::TuneSummary CudaBackend::tune_linears(std::span<const ops::LinearUse> linears, TuneTable& table,
                                                   bool measure) {
  TERN_CHECK(table.device() == tune_device(), "tune_linears: the table was measured on ", table.device(),
             ", this is ", tune_device());
  TuneSummary summary;
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, std::vector<const ops::LinearUse*>> by_key;  // weights of one shape share the choice
  for (const auto& l : linears) {
    ++summary.weights;
    TERN_CHECK(l.weight != nullptr && l.groups >= 1 && l.weight->out % l.groups == 0,
               "tune_linears: a weight without its groups");
    if (l.weight->exact) continue;  // the exact path has no groups
    if (linear_group_candidates(params_of(*impl_, *l.weight, l.groups)).empty()) {
      ++summary.not_streamed;
      continue;
    }
    by_key[tune_key(*l.weight, l.groups)].push_back(&l);
  }
  summary.shapes = static_cast<int>(by_key.size());
  for (const auto& [key, uses] : by_key) {
    const ops::Weight& w = *uses.front()->weight;
    const int64_t groups = uses.front()->groups;
    const TuneEntry* known = table.find(key);
    if (known == nullptr && measure) {
      // Copies of the weight (scales shared: small, and read from L2 in decode too), cycled so that every
      // call streams its weight from memory.
      const size_t bytes = w.weight.nbytes();
      const int copies = static_cast<int>(std::clamp<size_t>((kBeyondL2 + bytes - 1) / std::max<size_t>(bytes, 1), 1, kMaxCopies));
      std::vector<DeviceBuffer> store;
      std::vector<ops::Weight> replicas;
      for (int i = 0; i < copies; ++i) {
        store.emplace_back(bytes);
        device_copy(store.back().data(), w.weight.data(), bytes);
        ops::Weight r = w;
        r.weight = TensorView(store.back().data(), w.weight.dtype(), w.weight.shape(), Device::cuda);
        replicas.push_back(r);
      }
      const int64_t most_t = kTuneTokens[std::size(kTuneTokens) - 1];
      DeviceBuffer xbuf(static_cast<size_t>(most_t * groups * w.in) * sizeof(float));
      DeviceBuffer ybuf(static_cast<size_t>(most_t * w.out) * sizeof(float));
      TERN_CUDA(cudaMemset(xbuf.data(), 0x3c, xbuf.size()));  // x = 0.0115 everywhere: the time does not depend on it
      const std::vector<int> candidates = linear_group_candidates(params_of(*impl_, w, groups));
      const TuneEntry e = TuneTable::fastest(candidates, [&](int g) {
        for (const auto& r : replicas) impl_->linear_groups[r.weight.data()] = g;
        double total = 0;
        for (const int64_t T : kTuneTokens) {
          const TensorView x(xbuf.data(), DType::f32, {T, groups * w.in}, Device::cuda);
          const TensorView y(ybuf.data(), DType::f32, {T, w.out}, Device::cuda);
          total += time_graph([&](int i) { run_linear(*impl_, x, replicas[static_cast<size_t>(i)], groups, y); },
                              copies, 5)
                       .median_us;
        }
        return total;
      });
      for (const auto& r : replicas) impl_->linear_groups.erase(r.weight.data());
      TERN_CUDA(cudaDeviceSynchronize());  // the copies are freed next
      table.put(key, e);
      known = table.find(key);
      ++summary.measured;
      const auto used = [&](int g) {  // the groups a setting gives (0: the rule)
        LinearParams q = params_of(*impl_, w, groups);
        q.groups = g;
        return linear_groups_used(q);
      };
      const int rule = used(0);
      double rule_us = -1;
      for (const auto& [g, us] : e.tried)
        if (used(g) == rule) rule_us = us;
      summary.choices.push_back(cat(key, ": ", e.choice, " groups (", e.us, " us for T = 1 + 16 + 64; the rule's ", rule,
                                    rule_us >= 0 ? cat(": ", rule_us, " us)") : std::string(")")));
    } else if (known != nullptr) {
      ++summary.from_table;
    }
    if (known != nullptr)
      for (const ops::LinearUse* u : uses) {
        const void* at = device_mat(*u->weight).w;
        auto now = impl_->linear_groups.find(at);
        TERN_CHECK(!impl_->linear_ran.count(at) || (now != impl_->linear_groups.end() && now->second == known->choice),
                   "tune_linears: weight ", u->weight->name, " has already run with other K groups; tune before the "
                   "first forward (an earlier result, or a recorded graph, would differ from a later one)");
        impl_->linear_groups[at] = known->choice;
      }
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return summary;
}

}  // namespace tern::cuda
