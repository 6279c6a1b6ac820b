// What tern bench sends: the endpoint it talks to and the JSON body of each request.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "bench/chunk.h"
#include "bench/workload.h"

namespace tern::bench {

struct Target {
  std::string host = "127.0.0.1";
  std::string port = "30000";
  std::string path = "/v1/chat/completions";
  Api api = Api::chat;
  std::string model;             // empty: run_benchmark asks GET /v1/models
  std::string api_key;           // sent as "Authorization: Bearer KEY" when set
  bool ignore_eos = false;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  double timeout_s = 600;        // per request, from send to the end of the stream
};

// Parses "http://host:port" (a path after it replaces the API's default path). Throws tern::Error.
void parse_base_url(const std::string& url, Target& target);
// The default path for an API: /v1/chat/completions or /v1/completions.
const char* default_path(Api api);

// The streaming request body: usage requested (stream_options.include_usage), temperature 0.
std::string request_body(const Target& target, const RequestSpec& request, const std::string& user);
// The full HTTP/1.1 request (one connection per request, as the reference clients do).
std::string http_request(const Target& target, const std::string& body);

}  // namespace tern::bench
