// JSON from the network, parsed under limits: nesting depth, string bytes, array items, object members
// and values in all are checked while the document is read, before its memory is taken. nlohmann's
// dump(), copies and comparisons recurse once per level, so a document deeper than the stack allows
// crashed the process when re-serialised; a bounded depth makes every later walk safe. The one entry
// point for what arrives over a socket: requests to `tern serve` and `tern route`, the PD control
// channel's messages, and the JSON text inside requests (tool call arguments).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tern {

struct JsonLimits {
  int max_depth = 64;                             // nested arrays and objects
  size_t max_string_bytes = size_t{8} << 20;      // one string or key
  size_t max_array_items = size_t{1} << 20;       // one array (a token-id prompt is one)
  size_t max_object_members = 4096;               // one object
  size_t max_values = size_t{1} << 21;            // the whole document
};

// A document over a limit. `where` names the value as a request field path ("tools[0].function.parameters",
// at most a few levels deep), so a client sees what to fix.
class JsonLimitError : public Error {
 public:
  JsonLimitError(std::string where_, const std::string& message) : Error(message), where(std::move(where_)) {}
  std::string where;
};

// The parsed document; a discarded value (is_discarded()) when the text is not JSON. Throws
// JsonLimitError when the text is JSON over a limit. Json is nlohmann::json or nlohmann::ordered_json.
template <class Json>
Json parse_bounded(std::string_view text, const JsonLimits& limits = {});

}  // namespace tern
