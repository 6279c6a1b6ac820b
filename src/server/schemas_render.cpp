// Response rendering: the OpenAI shapes of completions, chat completions, their stream chunks, usage,
// and the tokenizer endpoints (errors and the model list: net/openai.h).
#include <nlohmann/json.hpp>

#include "engine/text_stream.h"
#include "server/schemas.h"

namespace tern::server {

using json = nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json head_json(const ResponseHead& h, const char* object) {
  return {{"id", h.id}, {"object", object}, {"created", h.created}, {"model", h.model}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json finish_json(const ChoiceOut& c) { return c.finish ? json(*c.finish) : json(nullptr); }

json byte_list(const std::string& b) {
  json out = json::array();
  for (unsigned char c : b) out.push_back(static_cast<int>(c));
  return out;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}
json chat_logprobs(const ChoiceOut& c, const TokenBytes& bytes) {
  if (!c.logprobs) return nullptr;
  json content = json::array();
  auto entry = [&](int32_t token, float logprob) {
    const std::string b = bytes(token);
    return json{{"token", engine::sanitize_utf8(b, true)}, {"logprob", logprob}, {"bytes", byte_list(b)}};
  };
  for (const auto& t : c.tokens) {
    json e = entry(t.token, t.logprob);
    json top = json::array();
    for (const auto& alt : t.top) top.push_back(entry(alt.token, alt.logprob));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

// Completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"}
json completion_logprobs(const ChoiceOut& c, const TokenBytes& bytes, int64_t offset) {
  if (!c.logprobs) return nullptr;
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : c.tokens) {
    const std::string text = engine::sanitize_utf8(bytes(t.token), true);
    tokens.push_back(text);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& alt : t.top) top[engine::sanitize_utf8(bytes(alt.token), true)] = alt.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json tool_calls_json(const ChoiceOut& c, bool delta) {
  json calls = json::array();
  for (size_t i = 0; i < c.tool_calls.size(); ++i) {
    const auto& t = c.tool_calls[i];
    json call{{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
    if (delta) call["index"] = c.tool_call_base + static_cast<int>(i);
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

std::string render_completion(const ResponseHead& head, const std::vector<ChoiceOut>& choices, const Usage& usage,
                              const TokenBytes& bytes) {
  json j = head_json(head, "text_completion");
  json cs = json::array();
  for (const auto& c : choices)
    cs.push_back({{"index", c.index}, {"text", c.text}, {"logprobs", completion_logprobs(c, bytes, 0)},
                  {"finish_reason", finish_json(c)}});
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string render_completion_chunk(const ResponseHead& head, const ChoiceOut& c, const TokenBytes& bytes) {
  json j = head_json(head, "text_completion");
  j["choices"] = json::array({{{"index", c.index}, {"text", c.text}, {"logprobs", completion_logprobs(c, bytes, 0)},
                               {"finish_reason", finish_json(c)}}});
  return dump(j);
}

std::string render_chat(const ResponseHead& head, const std::vector<ChoiceOut>& choices, const Usage& usage,
                        const TokenBytes& bytes) {
  json j = head_json(head, "chat.completion");
  json cs = json::array();
  for (const auto& c : choices) {
    json message{{"role", "assistant"}, {"content", c.text}};
    if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
    if (!c.tool_calls.empty()) {
      message["tool_calls"] = tool_calls_json(c, false);
      if (c.text.empty()) message["content"] = nullptr;
    }
    cs.push_back({{"index", c.index}, {"message", std::move(message)}, {"logprobs", chat_logprobs(c, bytes)},
                  {"finish_reason", finish_json(c)}});
  }
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string render_chat_chunk(const ResponseHead& head, const ChoiceOut& c, bool first, const TokenBytes& bytes) {
  json j = head_json(head, "chat.completion.chunk");
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  if (!c.text.empty() || (c.reasoning.empty() && c.tool_calls.empty() && !c.finish)) delta["content"] = c.text;
  if (!c.reasoning.empty()) delta["reasoning_content"] = c.reasoning;
  if (!c.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(c, true);
  j["choices"] = json::array(
      {{{"index", c.index}, {"delta", std::move(delta)}, {"logprobs", chat_logprobs(c, bytes)}, {"finish_reason", finish_json(c)}}});
  return dump(j);
}

std::string render_usage_chunk(const ResponseHead& head, const char* object, const Usage& usage) {
  json j = head_json(head, object);
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string render_tokenize(const std::vector<int32_t>& tokens, int64_t max_model_len) {
  return dump({{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", max_model_len}});
}

std::string render_detokenize(const std::string& text) { return dump({{"prompt", text}}); }

}  // namespace tern::server
