#include "bench/request.h"

#include "core/error.h"

namespace tern::bench {

const char* default_path(Api api) { return api == Api::chat ? "/v1/chat/completions" : "/v1/completions"; }

void parse_base_url(const std::string& url, Target& target) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else TERN_CHECK(rest.find("://") == std::string::npos, "tern bench: --base-url ", url,
                  ": only http:// is supported");
  std::size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos && slash + 1 < rest.size()) target.path = rest.substr(slash);
  std::size_t colon = authority.rfind(':');
  bool bracketed = !authority.empty() && authority.front() == '[';
  if (colon != std::string::npos && (!bracketed || authority[colon - 1] == ']')) {
    target.port = authority.substr(colon + 1);
    authority = authority.substr(0, colon);
  } else {
    target.port = "80";
  }
  if (bracketed) authority = authority.substr(1, authority.size() - 2);
  TERN_CHECK(!authority.empty(), "tern bench: --base-url ", url, " has no host");
  target.host = authority;
}

std::string request_body(const Target& target, const RequestSpec& request, const std::string& user) {
  nlohmann::json body = {{"model", target.model},
                         {"max_tokens", request.output_len},
                         {"temperature", 0.0},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  if (target.api == Api::chat) {
    TERN_CHECK(request.prompt_ids.empty(), "tern bench: token-id prompts need --api completions");
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt}}});
  } else if (!request.prompt_ids.empty()) {
    body["prompt"] = request.prompt_ids;
  } else {
    body["prompt"] = request.prompt;
  }
  if (target.ignore_eos) body["ignore_eos"] = true;
  if (!user.empty()) body["user"] = user;
  body.update(target.extra_body);
  return body.dump();
}

std::string http_request(const Target& target, const std::string& body) {
  bool v6 = target.host.find(':') != std::string::npos;
  std::string host = v6 ? "[" + target.host + "]" : target.host;
  std::string req = cat("POST ", target.path, " HTTP/1.1\r\nHost: ", host, ":", target.port,
                        "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n",
                        "Content-Length: ", body.size(), "\r\nConnection: close\r\n");
  if (!target.api_key.empty()) req += "Authorization: Bearer " + target.api_key + "\r\n";
  return req + "\r\n" + body;
}

}  // namespace tern::bench
