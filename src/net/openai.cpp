#include "net/openai.h"

#include <nlohmann/json.hpp>

namespace tern::net {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_, std::string code_)
    : std::runtime_error(std::move(message)),
      status(status_),
      param(std::move(param_)),
      type(type_.empty() ? (status_ == 404 ? "not_found_error" : status_ == 401 ? "authentication_error"
                                                                                : "invalid_request_error")
                         : std::move(type_)),
      code(std::move(code_)) {}

std::string render_error(const ApiError& e) {
  return dump({{"error",
                {{"message", e.what()},
                 {"type", e.type},
                 {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                 {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}});
}

Headers error_headers(const ApiError& e) {
  Headers h;
  if (e.status == 429 || e.status == 503) h.emplace_back("Retry-After", "1");
  if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
  return h;
}

std::string render_models(const std::string& model, int64_t created, int64_t max_model_len) {
  return dump({{"object", "list"},
               {"data", json::array({{{"id", model},
                                      {"object", "model"},
                                      {"created", created},
                                      {"owned_by", "tern"},
                                      {"max_model_len", max_model_len}}})}});
}

}  // namespace tern::net
