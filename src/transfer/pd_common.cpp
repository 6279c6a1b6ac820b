#include "transfer/pd_common.h"

#include <vector>

namespace tern::transfer {

const char* fail_reason_name(FailReason r) {
  switch (r) {
    case FailReason::connect: return "connect";
    case FailReason::peer_closed: return "peer_closed";
    case FailReason::peer_timeout: return "peer_timeout";
    case FailReason::rendezvous_timeout: return "rendezvous_timeout";
    case FailReason::transfer_timeout: return "transfer_timeout";
    case FailReason::refused: return "refused";
    case FailReason::peer_error: return "peer_error";
    case FailReason::aborted: return "aborted";
    case FailReason::count_: break;
  }
  return "?";
}

const char* pd_phase_name(PdPhase p) {
  switch (p) {
    case PdPhase::connect: return "connect";
    case PdPhase::handshake: return "handshake";
    case PdPhase::prefill: return "prefill";
    case PdPhase::transfer: return "transfer";
    case PdPhase::import: return "import";
    case PdPhase::count_: break;
  }
  return "?";
}

namespace {
std::vector<double> transfer_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0};
}
}  // namespace

PdMetrics::PdMetrics() : seconds(transfer_bounds()) {
  for (Histogram& h : phases) h = Histogram(transfer_bounds());
}

}  // namespace tern::transfer
