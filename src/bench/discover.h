// Model discovery: when no --model is given, tern bench asks the server which model it serves
// (GET /v1/models, the first entry), as sglang's bench_serving and vllm bench serve do.
#pragma once

#include <string>

#include "bench/request.h"

namespace tern::bench {

// The id of the first model listed by GET /v1/models at the target (with its API key). Throws
// tern::Error with the URL and the reason when the server is unreachable, answers an HTTP error or
// something that is not a model list, lists no models, or does not answer within timeout_s.
std::string discover_model(const Target& target, double timeout_s);

}  // namespace tern::bench
