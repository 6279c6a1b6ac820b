// Rules about a request's head that do not need a socket (RFC 9112), so that they are unit-tested alone.
#pragma once

#include <string>
#include <string_view>

namespace tern::net {

// True when a request with this Transfer-Encoding (the field's values joined by commas; "" when absent)
// can be read: absent, or exactly "chunked". Any other coding (gzip, "gzip, chunked", identity) is
// refused with 400 and a close: the body's length could not be known, and the bytes after the head
// must never be read as the next request (RFC 9112, 6.1 and 6.3).
bool transfer_coding_supported(std::string_view transfer_encoding);

// The origin form (path and query) of a request target: an absolute-form target
// ("http://host:port/v1/models?x") is reduced to it, as RFC 9112 (3.2.2) requires servers to accept;
// other targets are returned as they are.
std::string origin_form(std::string_view target);

}  // namespace tern::net
