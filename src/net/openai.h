// The OpenAI API's shapes that every front answers with, a server or the router (which has no engine):
// the error {"error": {"message", "type", "param", "code"}} and its headers, and the model list. The
// generation shapes are the server's (server/schemas.h).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "net/http.h"

namespace tern::net {

// An error answered in OpenAI's shape. An empty `type` is derived from the status (404:
// not_found_error, 401: authentication_error, else invalid_request_error).
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string type = {}, std::string code = {});
  int status;
  std::string param, type, code;
};

std::string render_error(const ApiError& e);
// The headers an error answer carries: Retry-After with 429 and 503, WWW-Authenticate with 401.
Headers error_headers(const ApiError& e);
// GET /v1/models: the one model served.
std::string render_models(const std::string& model, int64_t created, int64_t max_model_len);

}  // namespace tern::net
