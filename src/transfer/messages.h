// The payloads of the control frames (channel.h) as JSON, and the identity of a transfer. Decoding
// throws tern::Error naming what is malformed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "engine/request.h"

namespace tern::transfer {

constexpr int kProtocolVersion = 1;

// One transfer: the router's room id and the choice index inside the request (n > 1, several prompts).
struct RoomKey {
  uint64_t room = 0;
  uint32_t index = 0;
  bool operator==(const RoomKey&) const = default;
  std::string name() const;  // "<room as 16 hex digits (net/room.h)>/<index>"
};
struct RoomKeyHash {
  size_t operator()(const RoomKey& k) const { return std::hash<uint64_t>()(k.room * 1000003u + k.index); }
};

// What the decode side expects: the prefill side checks it against its own request.
struct Hello {
  int version = kProtocolVersion;
  RoomKey key;
  int64_t prompt_len = 0;
  uint64_t prompt_hash = 0;
  int64_t capacity = 0;  // state positions
  std::string model;
  std::string backend;   // transfer backend the decode side lands data with
};

// The prompt ran: what the decode side needs besides the state bytes.
struct Offer {
  int64_t state_bytes = 0;
  engine::GeneratedToken first;
  std::string rng;
};

std::string encode(const Hello& m);
std::string encode(const Offer& m);
Hello decode_hello(std::string_view json);
Offer decode_offer(std::string_view json);

// FNV-1a over the token ids (their 4 little-endian bytes each).
uint64_t prompt_hash(std::span<const int32_t> tokens);

}  // namespace tern::transfer
