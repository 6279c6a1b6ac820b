#include "bench/chunk.h"

#include <nlohmann/json.hpp>

namespace tern::bench {

namespace {

std::size_t string_size(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get_ref<const std::string&>().size() : 0;
}

void read_usage(const nlohmann::json& j, ChunkInfo& info) {
  auto usage = j.find("usage");
  if (usage == j.end() || !usage->is_object()) return;
  if (auto c = usage->find("completion_tokens"); c != usage->end() && c->is_number_integer())
    info.completion_tokens = c->get<int>();
  if (auto p = usage->find("prompt_tokens"); p != usage->end() && p->is_number_integer())
    info.prompt_tokens = p->get<int>();
}

std::string error_message(const nlohmann::json& err) {
  if (err.is_object()) return err.value("message", err.dump());
  return err.is_string() ? err.get<std::string>() : err.dump();
}

std::string excerpt(std::string_view s) {
  return std::string(s.substr(0, 80)) + (s.size() > 80 ? "..." : "");
}

}  // namespace

ChunkInfo read_chunk(std::string_view data, Api api) {
  ChunkInfo info;
  if (data == "[DONE]") {
    info.done = true;
    return info;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    info.malformed = true;
    info.error = "malformed SSE: data is not a JSON object: " + excerpt(data);
    return info;
  }
  if (auto err = j.find("error"); err != j.end() && !err->is_null()) {
    info.error = "server error in stream: " + error_message(*err);
    return info;
  }
  read_usage(j, info);
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return info;
  const nlohmann::json& choice = (*choices)[0];
  if (!choice.is_object()) return info;
  if (auto fr = choice.find("finish_reason"); fr != choice.end() && fr->is_string()) info.finish_reason = *fr;
  if (api == Api::completions) {
    info.content_bytes = string_size(choice, "text");
  } else if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
    // Reasoning models stream thoughts in reasoning_content (or reasoning): tokens all the same.
    info.content_bytes = string_size(*delta, "content") + string_size(*delta, "reasoning_content") +
                         string_size(*delta, "reasoning");
  }
  info.has_content = info.content_bytes > 0;
  return info;
}

}  // namespace tern::bench
