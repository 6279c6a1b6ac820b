// Options and metrics shared by the two sides of a transfer (prefill_rooms.h, decode_rooms.h).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

#include "core/histogram.h"
#include "transfer/channel.h"

namespace tern::transfer {

struct PdOptions {
  ChannelOptions channel;  // heartbeat, peer timeout, connect timeout
  // Prefill side: how long a room waits for its other half (the router's request or the decode
  // server's hello).
  std::chrono::milliseconds rendezvous_timeout{30000};
  // From the prefill side's offer to the decode side's ack: landing, writing and importing the state.
  std::chrono::milliseconds transfer_timeout{30000};
  std::string model;  // both sides must serve the same model
};

// Why a transfer failed (a label of tern:pd_transfers_failed_total).
enum class FailReason : uint8_t {
  connect,             // the decode side could not reach the prefill side
  peer_closed,         // the other process closed the connection (or died)
  peer_timeout,        // no heartbeat from the other side (dead process, cut link)
  rendezvous_timeout,  // the other half of the room never came
  transfer_timeout,    // the state did not land and import in time
  refused,             // the two sides disagree (model, prompt, sizes) or the import failed
  peer_error,          // the other side reported a failure
  aborted,             // this side's request ended first (client gone, timeout, shutdown)
  count_
};
const char* fail_reason_name(FailReason r);

// Where a decode-side transfer's time goes (a label of tern:pd_phase_seconds), in order:
enum class PdPhase : uint8_t {
  connect,    // the request arrived -> the control connection to the prefill server is up
  handshake,  // -> hello accepted and this side's memory reserved (reserved sent)
  prefill,    // -> the prefill server offers the state (it ran the prompt and exported the state)
  transfer,   // -> the bytes are in the landing (land, ready, the backend's write, done)
  import,     // -> the engine imported the state (the first token is delivered with it)
  count_
};
const char* pd_phase_name(PdPhase p);

struct PdMetrics {
  uint64_t transfers_ok = 0;
  std::array<uint64_t, static_cast<size_t>(FailReason::count_)> failed{};
  uint64_t bytes = 0;
  int64_t rooms = 0;          // transfers in progress
  int64_t landed_bytes = 0;   // decode side: landing memory held now
  Histogram seconds;  // offer -> ack (prefill side), ready -> import (decode side)
  // Decode side: each completed transfer's phases (empty on the prefill side).
  std::array<Histogram, static_cast<size_t>(PdPhase::count_)> phases;
  PdMetrics();
};

}  // namespace tern::transfer
