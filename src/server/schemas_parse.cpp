// Request parsing: strict types, ranges and known fields, each error naming its field (OpenAI's
// "param"), so a client sees exactly what to fix.
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "engine/text_stream.h"
#include "server/schemas.h"

namespace tern::server {

using json = nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw net::ApiError(400, message, param); }

// Every body is read by the bounded parser: a field nested or sized beyond the JSON limits is a 400 naming
// it, and nothing later (dump(), copies) can recurse deeper than the limit.
json parse_object(std::string_view body, const JsonLimits& limits) {
  json j;
  try {
    j = parse_bounded<json>(body, limits);
  } catch (const JsonLimitError& e) {
    bad(e.where, e.what());
  }
  if (j.is_discarded()) bad("", "the request body is not valid JSON");
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  return j;
}

void check_text(const std::string& s, const std::string& param) {
  size_t tail = 0;
  if (engine::sanitize_utf8(s, false, &tail) != s || tail != 0) bad(param, cat("'", param, "' is not valid UTF-8"));
}

void check_length(const std::string& s, size_t max, const std::string& param) {
  if (s.size() > max) bad(param, cat("'", param, "' is longer than ", max, " bytes"));
}

void check_count(const json& list, size_t max, const std::string& param, const char* what) {
  if (list.size() > max) bad(param, cat("'", param, "' holds ", list.size(), " ", what, "; at most ", max));
}

// o[key] when o is an object and it is a string, else "" (json::value() throws on other types).
std::string string_member(const json& o, const char* key) {
  if (!o.is_object()) return {};
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// JSON carried as text inside a request (a tool call's arguments) is held to the same limits: the chat
// encoder parses and re-serialises it. Text that is not JSON is kept as it is.
void check_json_text(const std::string& text, const std::string& param, const JsonLimits& limits) {
  try {
    parse_bounded<json>(text, limits);
  } catch (const JsonLimitError& e) {
    bad(param, cat("'", param, "' holds JSON that ", e.what()));
  }
}

// Reads fields of one object, remembering which were used, so that unknown ones can be rejected.
class Fields {
 public:
  Fields(const json& j, std::string prefix = {}) : j_(j), prefix_(std::move(prefix)) {}

  const json* get(const std::string& key) {
    used_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const std::string& key) const { return prefix_ + key; }

  std::optional<double> number(const std::string& key, double lo, double hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(name(key), cat("'", name(key), "' must be a number"));
    const double d = v->get<double>();
    if (!(d >= lo && d <= hi)) bad(name(key), cat("'", name(key), "' must be between ", lo, " and ", hi, ", got ", d));
    return d;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) bad(name(key), cat("'", name(key), "' must be an integer"));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(name(key), cat("'", name(key), "' is too large"));
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) bad(name(key), cat("'", name(key), "' must be between ", lo, " and ", hi, ", got ", i));
    return i;
  }
  std::optional<bool> boolean(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(name(key), cat("'", name(key), "' must be a boolean"));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key, size_t max_bytes = SIZE_MAX) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(name(key), cat("'", name(key), "' must be a string"));
    auto s = v->get<std::string>();
    check_length(s, max_bytes, name(key));
    check_text(s, name(key));
    return s;
  }
  // Fields clients send that tern accepts only with their default meaning.
  void default_only(const std::string& key, const std::function<bool(const json&)>& is_default) {
    const json* v = get(key);
    if (v && !is_default(*v)) bad(name(key), cat("'", name(key), "' is not supported with this value"));
  }
  void reject_unknown() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!used_.count(it.key()))
        bad(name(it.key()), cat("Unrecognized request argument supplied: ", name(it.key())));
  }

 private:
  const json& j_;
  std::string prefix_;
  std::set<std::string> used_;
};

std::vector<int32_t> token_list(const json& v, const std::string& param, int64_t vocab) {
  std::vector<int32_t> out;
  for (const auto& t : v) {
    if (!t.is_number_integer()) bad(param, cat("'", param, "' must hold integer token ids"));
    const auto id = t.get<int64_t>();
    if (id < 0 || id >= vocab) bad(param, cat("token id ", id, " in '", param, "' is outside [0, ", vocab, ")"));
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

void parse_model(Fields& f, GenerationParams& p, const ParseLimits& limits) {
  p.model = f.string("model", limits.max_label_bytes).value_or(limits.model);
  if (p.model != limits.model)
    throw net::ApiError(404, cat("The model '", p.model, "' does not exist; this server serves '", limits.model, "'"),
                   "model", "not_found_error", "model_not_found");
}

void parse_stop(Fields& f, GenerationParams& p, const ParseLimits& limits) {
  if (const json* v = f.get("stop")) {
    if (v->is_string()) {
      p.stop.stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      for (const auto& s : *v) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        p.stop.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of strings");
    }
    if (p.stop.stop.size() > limits.max_stop) bad("stop", cat("'stop' holds at most ", limits.max_stop, " strings"));
    for (const auto& s : p.stop.stop) {
      if (s.empty()) bad("stop", "'stop' strings must not be empty");
      check_text(s, "stop");
    }
  }
  if (const json* v = f.get("stop_token_ids")) {
    if (!v->is_array()) bad("stop_token_ids", "'stop_token_ids' must be a list of token ids");
    p.stop.stop_token_ids = token_list(*v, "stop_token_ids", limits.vocab_size);
  }
}

// The sampling and stopping fields both endpoints share.
void parse_common(Fields& f, GenerationParams& p, const ParseLimits& limits) {
  parse_model(f, p, limits);
  auto& s = p.sampling;
  s.temperature = static_cast<float>(f.number("temperature", 0, 2).value_or(1.0));
  s.top_p = static_cast<float>(f.number("top_p", 0, 1).value_or(1.0));
  if (s.top_p <= 0) bad("top_p", "'top_p' must be greater than 0");
  const int64_t top_k = f.integer("top_k", -1, 1 << 30).value_or(0);
  s.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  s.min_p = static_cast<float>(f.number("min_p", 0, 1).value_or(0.0));
  s.presence_penalty = static_cast<float>(f.number("presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 0.01, 10).value_or(1.0));
  if (auto seed = f.integer("seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*seed);
  auto max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (auto m = f.integer("max_completion_tokens", 1, INT32_MAX)) max_tokens = m;
  p.max_tokens_given = max_tokens.has_value();
  if (max_tokens) p.stop.max_tokens = *max_tokens;
  p.n = static_cast<int>(f.integer("n", 1, limits.max_n).value_or(1));
  f.default_only("best_of", [&](const json& v) { return v.is_number_integer() && v.get<int64_t>() == p.n; });
  p.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    Fields sf(*so, "stream_options.");
    p.include_usage = sf.boolean("include_usage").value_or(false);
    sf.boolean("continuous_usage_stats");
    sf.reject_unknown();
  }
  p.stop.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.user = f.string("user", limits.max_label_bytes).value_or("");
  parse_stop(f, p, limits);
  f.default_only("logit_bias", [](const json& v) { return v.is_object() && v.empty(); });
  f.default_only("skip_special_tokens", [](const json& v) { return v == json(true); });
  for (const char* ignored : {"store", "metadata", "service_tier", "parallel_tool_calls"}) f.get(ignored);
}

}  // namespace

CompletionRequest parse_completion(std::string_view body, const ParseLimits& limits) {
  const json j = parse_object(body, limits.json);
  Fields f(j);
  CompletionRequest r;
  parse_common(f, r.params, limits);
  if (const json* lp = f.get("logprobs")) {  // legacy: an integer count of alternatives
    if (!lp->is_number_integer()) bad("logprobs", "'logprobs' must be an integer (0 to 5 alternatives)");
    const auto k = lp->get<int64_t>();
    if (k < 0 || k > limits.max_top_logprobs)
      bad("logprobs", cat("'logprobs' must be between 0 and ", limits.max_top_logprobs));
    r.params.logprobs = true;
    r.params.sampling.top_logprobs = static_cast<int>(k);
  }
  f.default_only("echo", [](const json& v) { return v == json(false); });
  f.default_only("suffix", [](const json& v) { return v.is_string() && v.get<std::string>().empty(); });
  const json* prompt = f.get("prompt");
  if (!prompt) bad("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.text_prompts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number_integer()) {
    r.token_prompts.push_back(token_list(*prompt, "prompt", limits.vocab_size));
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const auto& p : *prompt) {
      if (p.is_string()) r.text_prompts.push_back(p.get<std::string>());
      else if (p.is_array()) r.token_prompts.push_back(token_list(p, "prompt", limits.vocab_size));
      else bad("prompt", "'prompt' must be a string, a list of strings, or token ids");
    }
    if (!r.text_prompts.empty() && !r.token_prompts.empty()) bad("prompt", "'prompt' mixes strings and token ids");
  } else {
    bad("prompt", "'prompt' must be a non-empty string, list of strings, or token ids");
  }
  for (const auto& t : r.text_prompts) check_text(t, "prompt");
  if (r.text_prompts.size() + r.token_prompts.size() > limits.max_prompts)
    bad("prompt", cat("at most ", limits.max_prompts, " prompts per request"));
  for (const auto& t : r.token_prompts)
    if (t.empty()) bad("prompt", "a token prompt must not be empty");
  f.reject_unknown();
  return r;
}

namespace {

std::string message_content(const json& v, const std::string& param) {
  if (v.is_null()) return {};
  if (v.is_string()) {
    check_text(v.get<std::string>(), param);
    return v.get<std::string>();
  }
  if (!v.is_array()) bad(param, cat("'", param, "' must be a string or a list of text parts"));
  std::string text;
  for (const auto& part : v) {
    if (string_member(part, "type") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(param, cat("'", param, "' parts must be {\"type\": \"text\", \"text\": ...} (this model reads text only)"));
    text += part["text"].get<std::string>();
  }
  check_text(text, param);
  return text;
}

// The history's tool calls, strictly typed: the chat encoder reads them again from the request's JSON.
std::vector<ToolCall> message_tool_calls(const json& v, const std::string& param, const ParseLimits& limits) {
  if (!v.is_array()) bad(param, cat("'", param, "' must be a list"));
  check_count(v, limits.max_tool_calls, param, "tool calls");
  std::vector<ToolCall> calls;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = cat(param, "[", i, "]");
    const json* fn = v[i].is_object() ? &v[i] : nullptr;
    if (fn) fn = v[i].contains("function") && v[i]["function"].is_object() ? &v[i]["function"] : nullptr;
    if (!fn) bad(at, cat("'", at, "' must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}"));
    Fields c(v[i], at + ".");
    ToolCall call;
    call.id = c.string("id", limits.max_label_bytes).value_or("");
    if (c.string("type").value_or("function") != "function") bad(at + ".type", cat("'", at, ".type' must be function"));
    c.get("function");
    c.reject_unknown();
    Fields f(*fn, at + ".function.");
    call.name = f.string("name", limits.max_name_bytes).value_or("");
    if (call.name.empty()) bad(at + ".function.name", cat("'", at, ".function.name' is required"));
    const json* args = f.get("arguments");
    if (!args) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();
      check_text(call.arguments, at + ".function.arguments");
      check_json_text(call.arguments, at + ".function.arguments", limits.json);
    } else if (args->is_object()) {
      call.arguments = args->dump();  // depth bounded by the parser
    } else {
      bad(at + ".function.arguments", cat("'", at, ".function.arguments' must be a JSON string or object"));
    }
    f.reject_unknown();
    calls.push_back(std::move(call));
  }
  return calls;
}

ChatMessage parse_message(const json& m, size_t i, const ParseLimits& limits) {
  const std::string param = cat("messages[", i, "]");
  if (!m.is_object()) bad(param, cat("'", param, "' must be an object"));
  Fields f(m, param + ".");
  ChatMessage msg;
  msg.role = f.string("role").value_or("");
  static const std::set<std::string> roles{"system", "developer", "user", "assistant", "tool"};
  if (!roles.count(msg.role)) bad(param + ".role", cat("'", param, ".role' must be one of system, developer, user, assistant, tool"));
  if (const json* c = f.get("content")) msg.content = message_content(*c, param + ".content");
  else if (msg.role != "assistant") bad(param + ".content", cat("'", param, ".content' is required"));
  msg.reasoning_content = f.string("reasoning_content").value_or("");
  if (const json* tc = f.get("tool_calls")) msg.tool_calls = message_tool_calls(*tc, param + ".tool_calls", limits);
  msg.tool_call_id = f.string("tool_call_id", limits.max_label_bytes).value_or("");
  msg.name = f.string("name", limits.max_label_bytes).value_or("");
  f.reject_unknown();
  return msg;
}

std::vector<ToolSpec> parse_tools(const json& v, const ParseLimits& limits) {
  if (!v.is_array()) bad("tools", "'tools' must be a list");
  check_count(v, limits.max_tools, "tools", "tools");
  std::vector<ToolSpec> tools;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string param = cat("tools[", i, "]");
    if (!t.is_object() || (t.contains("type") && string_member(t, "type") != "function") || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
      bad(param, cat("'", param, "' must be {\"type\": \"function\", \"function\": {\"name\", ...}}"));
    const json& fn = t["function"];
    ToolSpec spec;
    spec.name = fn["name"].get<std::string>();
    check_length(spec.name, limits.max_name_bytes, param + ".function.name");
    if (fn.contains("description") && !fn["description"].is_string() && !fn["description"].is_null())
      bad(param + ".function.description", cat("'", param, ".function.description' must be a string"));
    spec.description = string_member(fn, "description");
    const json* params = fn.contains("parameters") && !fn["parameters"].is_null() ? &fn["parameters"] : nullptr;
    if (params && !params->is_object())
      bad(param + ".function.parameters", cat("'", param, ".function.parameters' must be a JSON schema object"));
    spec.parameters = params ? params->dump() : "{}";  // depth bounded by the parser
    tools.push_back(std::move(spec));
  }
  return tools;
}

std::string parse_tool_choice(const json& v, const std::vector<ToolSpec>& tools) {
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s != "auto" && s != "none" && s != "required") bad("tool_choice", "'tool_choice' must be auto, none, required or a function");
    return s;
  }
  if (v.is_object() && v.contains("function") && v["function"].is_object() && v["function"].contains("name") &&
      v["function"]["name"].is_string()) {
    const auto name = v["function"]["name"].get<std::string>();
    for (const auto& t : tools)
      if (t.name == name) return name;
    bad("tool_choice", cat("'tool_choice' names the function '", name, "', which is not in 'tools'"));
  }
  bad("tool_choice", "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\"}}");
}

void keep_ordered_json(std::string_view body, ChatRequest& r, const ParseLimits& limits) {
  const auto o = parse_bounded<nlohmann::ordered_json>(body, limits.json);  // checked already: within the limits
  r.messages_json = o.at("messages").dump();
  if (o.contains("tools") && !o["tools"].is_null()) r.tools_json = o["tools"].dump();
}

void parse_chat_fields(Fields& f, ChatRequest& r, const ParseLimits& limits) {
  const json* messages = f.get("messages");
  if (!messages || !messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
  check_count(*messages, limits.max_messages, "messages", "messages");
  for (size_t i = 0; i < messages->size(); ++i) r.messages.push_back(parse_message((*messages)[i], i, limits));
  if (const json* t = f.get("tools")) r.tools = parse_tools(*t, limits);
  if (const json* tc = f.get("tool_choice")) r.tool_choice = parse_tool_choice(*tc, r.tools);
  if (const json* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    Fields kf(*k, "chat_template_kwargs.");
    if (auto t = kf.boolean("thinking")) r.thinking = t;
    if (auto t = kf.boolean("enable_thinking")) r.thinking = t;
    kf.reject_unknown();
  }
  if (auto effort = f.string("reasoning_effort")) {
    static const std::set<std::string> efforts{"none", "minimal", "low", "medium", "high", "max"};
    if (!efforts.count(*effort)) bad("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium, high or max");
    r.reasoning_effort = *effort;
  }
  f.default_only("response_format", [](const json& v) { return string_member(v, "type") == "text"; });
}

}  // namespace

ChatRequest parse_chat(std::string_view body, const ParseLimits& limits) {
  const json j = parse_object(body, limits.json);
  Fields f(j);
  ChatRequest r;
  parse_common(f, r.params, limits);
  r.params.logprobs = f.boolean("logprobs").value_or(false);
  const auto top = f.integer("top_logprobs", 0, limits.max_top_logprobs);
  if (top && !r.params.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (r.params.logprobs) r.params.sampling.top_logprobs = static_cast<int>(top.value_or(0));
  parse_chat_fields(f, r, limits);
  f.reject_unknown();
  keep_ordered_json(body, r, limits);
  return r;
}

TokenizeRequest parse_tokenize(std::string_view body, const ParseLimits& limits) {
  const json j = parse_object(body, limits.json);
  Fields f(j);
  TokenizeRequest r;
  GenerationParams p;
  parse_model(f, p, limits);
  r.model = p.model;
  r.add_special_tokens = f.boolean("add_special_tokens").value_or(true);
  if (auto prompt = f.string("prompt")) {
    r.prompt = *prompt;
  } else if (f.get("messages")) {
    ChatRequest chat;
    parse_chat_fields(f, chat, limits);
    keep_ordered_json(body, chat, limits);
    r.chat = std::move(chat);
  } else {
    bad("prompt", "'prompt' (a string) or 'messages' is required");
  }
  f.reject_unknown();
  return r;
}

DetokenizeRequest parse_detokenize(std::string_view body, const ParseLimits& limits) {
  const json j = parse_object(body, limits.json);
  Fields f(j);
  DetokenizeRequest r;
  GenerationParams p;
  parse_model(f, p, limits);
  r.model = p.model;
  const json* tokens = f.get("tokens");
  if (!tokens || !tokens->is_array()) bad("tokens", "'tokens' must be a list of token ids");
  r.tokens = token_list(*tokens, "tokens", limits.vocab_size);
  f.reject_unknown();
  return r;
}

}  // namespace tern::server
