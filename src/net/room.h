// A prefill-decode room id (the transfers of one request) as it travels: 16 lowercase hex digits in the
// router's X-Tern-Room header and in the transfer protocol's messages (src/transfer).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tern::net {

std::string room_hex(uint64_t room);
// 1 to 16 hex digits (either case) -> room; throws tern::Error on anything else.
uint64_t parse_room(std::string_view hex);

}  // namespace tern::net
