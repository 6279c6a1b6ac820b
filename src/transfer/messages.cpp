#include "transfer/messages.h"

#include <nlohmann/json.hpp>

#include "core/bounded_json.h"
#include "core/error.h"
#include "net/room.h"

namespace tern::transfer {

using nlohmann::json;

std::string RoomKey::name() const { return cat(net::room_hex(room), "/", index); }

namespace {

// A control message is small and flat: the parser's limits are set to what one can hold (the sampler
// state is the longest string, the top logprobs the largest array), so a peer cannot make the parse or
// anything after it deep or large.
JsonLimits message_limits() {
  JsonLimits l;
  l.max_depth = 4;
  l.max_string_bytes = 64 << 10;
  l.max_array_items = 64;
  l.max_object_members = 32;
  l.max_values = 512;
  return l;
}

json parse(std::string_view text, const char* what) {
  json j;
  try {
    j = parse_bounded<json>(text, message_limits());
  } catch (const JsonLimitError& e) {
    throw Error(cat("malformed ", what, " message: ", e.what()));
  }
  TERN_CHECK(!j.is_discarded() && j.is_object(), "malformed ", what, " message: not a JSON object");
  return j;
}

template <typename T>
T field(const json& j, const char* name, const char* what) {
  auto it = j.find(name);
  TERN_CHECK(it != j.end(), "malformed ", what, " message: no \"", name, "\"");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(cat("malformed ", what, " message: \"", name, "\" has the wrong type"));
  }
}

}  // namespace

std::string encode(const Hello& m) {
  return json{{"version", m.version},       {"room", net::room_hex(m.key.room)}, {"index", m.key.index},
              {"prompt_len", m.prompt_len}, {"prompt_hash", m.prompt_hash}, {"capacity", m.capacity},
              {"model", m.model},           {"backend", m.backend}}
      .dump();
}

Hello decode_hello(std::string_view text) {
  const json j = parse(text, "hello");
  Hello m;
  m.version = field<int>(j, "version", "hello");
  TERN_CHECK(m.version == kProtocolVersion, "the decode server speaks transfer protocol version ", m.version,
             ", this server ", kProtocolVersion);
  m.key.room = net::parse_room(field<std::string>(j, "room", "hello"));
  m.key.index = field<uint32_t>(j, "index", "hello");
  m.prompt_len = field<int64_t>(j, "prompt_len", "hello");
  m.prompt_hash = field<uint64_t>(j, "prompt_hash", "hello");
  m.capacity = field<int64_t>(j, "capacity", "hello");
  m.model = field<std::string>(j, "model", "hello");
  m.backend = field<std::string>(j, "backend", "hello");
  return m;
}

std::string encode(const Offer& m) {
  json top = json::array();
  for (const auto& t : m.first.top) top.push_back({t.token, t.logprob});
  return json{{"state_bytes", m.state_bytes},
              {"token", m.first.token},
              {"logprob", m.first.logprob},
              {"top", std::move(top)},
              {"rng", m.rng}}
      .dump();
}

Offer decode_offer(std::string_view text) {
  const json j = parse(text, "offer");
  Offer m;
  m.state_bytes = field<int64_t>(j, "state_bytes", "offer");
  TERN_CHECK(m.state_bytes > 0, "malformed offer message: state_bytes ", m.state_bytes);
  m.first.token = field<int32_t>(j, "token", "offer");
  m.first.logprob = field<float>(j, "logprob", "offer");
  const auto top = j.find("top");
  TERN_CHECK(top != j.end() && top->is_array(), "malformed offer message: \"top\" is not a list");
  for (const auto& t : *top) {
    TERN_CHECK(t.is_array() && t.size() == 2 && t[0].is_number_integer() && t[1].is_number(),
               "malformed offer message: top logprobs");
    m.first.top.push_back({t[0].get<int32_t>(), t[1].get<float>()});
  }
  m.rng = field<std::string>(j, "rng", "offer");
  return m;
}

uint64_t prompt_hash(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

}  // namespace tern::transfer
