#include "tokenizer/chat_encoding.h"

#include <algorithm>
#include <map>
#include <vector>

#include "core/bounded_json.h"
#include "core/error.h"

namespace tern::tokenizer {
namespace {

using namespace chat_tokens;
using Messages = std::vector<ordered_json>;

const std::string kDsml = dsml;

const char* const kEffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const char* const kEffortBeyond =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
    "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
    "underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain "
    "that no assumption remains unchecked and no error remains undiscovered.\n\n";

const std::map<std::string, std::string> kTaskTokens = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},   {"read_url", "<｜read_url｜>"}};

std::string tools_section(const std::string& schemas) {
  const std::string d = kDsml;
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
         "writing a \"<" + d + "tool_calls>\" block like the following:\n\n<" + d + "tool_calls>\n<" + d +
         "invoke name=\"$TOOL_NAME\">\n<" + d + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"
         "$PARAMETER_VALUE</" + d + "parameter>\n...\n</" + d + "invoke>\n<" + d + "invoke name=\"$TOOL_NAME2\">\n...\n</" +
         d + "invoke>\n</" + d + "tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. "
         "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
         "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete "
         "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly "
         "after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n" + schemas +
         "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
}

void dump_string(const std::string& s, std::string& out) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump(const ordered_json& v, std::string& out) {
  if (v.is_string()) {
    dump_string(v.get_ref<const std::string&>(), out);
  } else if (v.is_array()) {
    out += '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dump(v[i], out);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ", ";
      first = false;
      dump_string(key, out);
      out += ": ";
      dump(value, out);
    }
    out += '}';
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d != d) out += "NaN"; else if (d == 1.0 / 0.0) out += "Infinity"; else if (d == -1.0 / 0.0) out += "-Infinity"; else out += v.dump();
  } else {
    out += v.dump();  // null, booleans, integers
  }
}

// Python's `x or ""` for a message field: absent, null, "" -> "". Lists of text parts are joined.
std::string text_of(const ordered_json& msg, const char* key, const std::string& where) {
  const auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    std::string joined;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const ordered_json& part = (*it)[i];
      TERN_CHECK(part.is_object() && part.value("type", "") == "text" && part.contains("text"), where, ".", key, "[", i,
                 "]: only {\"type\": \"text\", \"text\": ...} parts are supported");
      if (i) joined += "\n\n";
      joined += part["text"].get<std::string>();
    }
    return joined;
  }
  fail(where, ".", key, ": expected a string, found ", it->type_name());
}

bool truthy(const ordered_json& msg, const char* key) {
  const auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return false;
  if (it->is_array() || it->is_object() || it->is_string()) return !it->empty();
  if (it->is_boolean()) return it->get<bool>();
  return true;
}

std::string role_of(const ordered_json& msg) { return msg.is_object() ? msg.value("role", "") : ""; }

// The reference's merge_tool_messages: tool results become <tool_result> blocks of a user turn, and
// consecutive user/tool messages share one user turn.
Messages merge_tool_messages(const Messages& messages) {
  Messages merged;
  for (const ordered_json& msg : messages) {
    const std::string role = role_of(msg);
    const bool prev_user_blocks = !merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks");
    if (role == "tool") {
      ordered_json block = {{"type", "tool_result"}, {"tool_use_id", msg.value("tool_call_id", ordered_json(""))},
                            {"content", msg.value("content", ordered_json(""))}};
      if (prev_user_blocks) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", ordered_json::array({std::move(block)})}});
      }
    } else if (role == "user") {
      ordered_json text = {{"type", "text"}, {"text", msg.value("content", ordered_json(""))}};
      const bool prev_task = merged.empty() ? false : merged.back().contains("task") && !merged.back()["task"].is_null();
      if (prev_user_blocks && !prev_task) {
        merged.back()["content_blocks"].push_back(std::move(text));
      } else {
        ordered_json m = {{"role", "user"}, {"content", msg.value("content", ordered_json(""))},
                          {"content_blocks", ordered_json::array({std::move(text)})}};
        for (const char* key : {"task", "wo_eos", "mask"})
          if (msg.contains(key)) m[key] = msg[key];
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

// The reference's sort_tool_results_by_call_order: results follow the order of the calls.
void sort_tool_results(Messages& messages) {
  std::map<std::string, int> order;
  for (ordered_json& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(msg, "tool_calls")) {
      order.clear();
      int idx = 0;
      for (const ordered_json& tc : msg["tool_calls"]) {
        std::string id = tc.value("id", "");
        if (id.empty() && tc.contains("function")) id = tc["function"].value("id", "");
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(msg, "content_blocks")) {
      ordered_json& blocks = msg["content_blocks"];
      std::vector<ordered_json> results;
      for (const ordered_json& b : blocks)
        if (b.value("type", "") == "tool_result") results.push_back(b);
      if (results.size() <= 1 || order.empty()) continue;
      const auto rank = [&](const ordered_json& b) {
        const auto it = order.find(b.value("tool_use_id", ""));
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
      std::size_t next = 0;
      for (ordered_json& b : blocks)
        if (b.value("type", "") == "tool_result") b = results[next++];
    }
  }
}

int last_user_index(const Messages& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[i]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

// The reference's _drop_thinking_messages.
Messages drop_thinking_messages(const Messages& messages) {
  const int last_user = last_user_index(messages);
  Messages kept;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const std::string role = role_of(messages[i]);
    if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
        role == "direct_search_results" || i >= last_user) {
      kept.push_back(messages[i]);
    } else if (role == "assistant") {
      ordered_json m = messages[i];
      m.erase("reasoning_content");
      kept.push_back(std::move(m));
    }  // developer (and other) messages before the last user turn are dropped
  }
  return kept;
}

std::string render_tools(const ordered_json& tools, const std::string& where) {
  std::string schemas;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    TERN_CHECK(tools[i].is_object() && tools[i].contains("function"), where, ".tools[", i,
               "]: expected {\"type\": \"function\", \"function\": {...}}");
    if (i) schemas += "\n";
    schemas += python_json_dumps(tools[i]["function"]);
  }
  return tools_section(schemas);
}

std::string response_format_section(const ordered_json& format) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" + python_json_dumps(format);
}

std::string encode_arguments(const ordered_json& call, const std::string& where) {
  TERN_CHECK(call.is_object() && call.contains("function") && call["function"].contains("name"), where,
             ": expected {\"function\": {\"name\": ..., \"arguments\": ...}}");
  const ordered_json& raw = call["function"].value("arguments", ordered_json("{}"));
  ordered_json args;
  if (raw.is_object()) {
    args = raw;
  } else {
    const std::string text = raw.is_string() ? raw.get<std::string>() : raw.dump();
    args = parse_bounded<ordered_json>(text);  // over the JSON limits: an error (re-serialising recurses)
    if (args.is_discarded() || !args.is_object()) args = {{"arguments", text}};  // as the reference falls back
  }
  std::string out;
  for (const auto& [key, value] : args.items()) {
    if (!out.empty()) out += "\n";
    const bool is_str = value.is_string();
    out += "<" + kDsml + "parameter name=\"" + key + "\" string=\"" + (is_str ? "true" : "false") + "\">" +
           (is_str ? value.get<std::string>() : python_json_dumps(value)) + "</" + kDsml + "parameter>";
  }
  return out;
}

std::string render_tool_calls(const ordered_json& calls, const std::string& where) {
  std::string invokes;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const std::string w = where + ".tool_calls[" + std::to_string(i) + "]";
    const std::string args = encode_arguments(calls[i], w);
    if (i) invokes += "\n";
    invokes += "<" + kDsml + "invoke name=\"" + calls[i]["function"]["name"].get<std::string>() + "\">\n" + args + "\n</" +
               kDsml + "invoke>";
  }
  return "\n\n<" + kDsml + "tool_calls>\n" + invokes + "\n</" + kDsml + "tool_calls>";
}

std::string user_blocks(const ordered_json& blocks) {
  std::string out;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const ordered_json& b = blocks[i];
    const std::string type = b.value("type", "");
    if (i) out += "\n\n";
    if (type == "text") {
      out += text_of(b, "text", "content block");
    } else if (type == "tool_result") {
      std::string content;
      const ordered_json& c = b.value("content", ordered_json(""));
      if (c.is_array()) {
        for (std::size_t k = 0; k < c.size(); ++k) {
          if (k) content += "\n\n";
          const std::string t = c[k].value("type", "");
          content += t == "text" ? c[k].value("text", "") : "[Unsupported " + t + "]";
        }
      } else {
        content = c.is_string() ? c.get<std::string>() : c.is_null() ? "None" : python_json_dumps(c);
      }
      out += "<tool_result>" + content + "</tool_result>";
    } else {
      out += "[Unsupported " + type + "]";
    }
  }
  return out;
}

struct Renderer {
  const Messages& messages;
  const ChatOptions& opt;
  bool drop_thinking;
  int last_user;

  bool thinking() const { return opt.thinking_mode == ThinkingMode::thinking; }

  std::string effort_prefix() const {
    const std::string effort = opt.reasoning_effort.value_or("");
    if (opt.effort_prompts == EffortPrompts::flash_release) {
      TERN_CHECK(effort.empty() || effort == "high" || effort == "max", "reasoning_effort \"", effort,
                 "\" is not one of \"high\", \"max\" (or none)");
      return effort == "max" ? kEffortHigh : "";
    }
    TERN_CHECK(effort.empty() || effort == "low" || effort == "high" || effort == "max", "reasoning_effort \"",
               effort, "\" is not one of \"low\", \"high\", \"max\" (or none)");
    return effort == "high" ? kEffortHigh : effort == "max" ? kEffortBeyond : "";
  }

  std::string assistant_turn(int index, const ordered_json& msg, const std::string& where) const {
    std::string calls;
    if (truthy(msg, "tool_calls")) calls = render_tool_calls(msg["tool_calls"], where);
    const bool prev_has_task = index > 0 && messages[index - 1].contains("task") && !messages[index - 1]["task"].is_null();
    std::string reasoning;
    if (thinking() && !prev_has_task && (!drop_thinking || index > last_user)) {
      reasoning = text_of(msg, msg.contains("reasoning_content") ? "reasoning_content" : "reasoning", where) + think_end;
    }
    const bool wo_eos = msg.value("wo_eos", false);
    return reasoning + text_of(msg, "content", where) + calls + (wo_eos ? "" : eos);
  }

  std::string body(int index, const ordered_json& msg, const std::string& role, const std::string& where) const {
    const bool has_tools = truthy(msg, "tools");
    const bool has_format = truthy(msg, "response_format");
    std::string extra;
    if (has_tools) extra += "\n\n" + render_tools(msg["tools"], where);
    if (has_format) extra += "\n\n" + response_format_section(msg["response_format"]);
    if (role == "system") return text_of(msg, "content", where) + extra;
    if (role == "developer") {
      const std::string content = text_of(msg, "content", where);
      TERN_CHECK(!content.empty(), where, ": a developer message needs content");
      return user + content + extra;
    }
    if (role == "user") {
      if (truthy(msg, "content_blocks")) return user + user_blocks(msg["content_blocks"]);
      return user + text_of(msg, "content", where);
    }
    if (role == "latest_reminder") {
      const auto it = msg.find("content");
      return std::string(latest_reminder) + (it == msg.end() || it->is_null() ? "None" : text_of(msg, "content", where));
    }
    if (role == "assistant") return assistant_turn(index, msg, where);
    if (role == "tool") fail(where, ": tool messages must follow an assistant message with tool_calls");
    fail(where, ": unknown role \"", role, "\" (expected system, user, assistant, tool, developer, latest_reminder)");
  }

  // What opens the next turn after message `index`.
  std::string transition(int index, const ordered_json& msg, const std::string& role) const {
    if (index + 1 < static_cast<int>(messages.size())) {
      const std::string next = role_of(messages[index + 1]);
      if (next != "assistant" && next != "latest_reminder") return "";
    }
    if (msg.contains("task") && !msg["task"].is_null()) {
      const std::string task = msg["task"].get<std::string>();
      const auto it = kTaskTokens.find(task);
      TERN_CHECK(it != kTaskTokens.end(), "invalid task \"", task, "\" (expected action, query, authority, domain, title, read_url)");
      if (task != "action") return it->second;
      return std::string(chat_tokens::assistant) + (thinking() ? think_begin : think_end) + it->second;
    }
    if (role != "user" && role != "developer") return "";
    const bool open_thinking = thinking() && (!drop_thinking || index >= last_user);
    return std::string(chat_tokens::assistant) + (open_thinking ? think_begin : think_end);
  }

  std::string render(int index) const {
    const ordered_json& msg = messages[index];
    const std::string where = "messages[" + std::to_string(index) + "]";
    TERN_CHECK(msg.is_object(), where, ": expected an object with a role");
    const std::string role = role_of(msg);
    std::string prompt = index == 0 && thinking() ? effort_prefix() : "";
    prompt += body(index, msg, role, where);
    return prompt + transition(index, msg, role);
  }
};

Messages as_list(const ordered_json& j, const char* what) {
  if (j.is_null()) return {};
  TERN_CHECK(j.is_array(), what, ": expected an array of messages, found ", j.type_name());
  return Messages(j.begin(), j.end());
}

}  // namespace

std::string python_json_dumps(const ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string encode_chat(const ordered_json& messages_json, const ChatOptions& options, const ordered_json& tools,
                        const ordered_json& context_json) {
  Messages raw = as_list(messages_json, "messages");
  if (tools.is_array() && !tools.empty()) {
    auto sys = std::find_if(raw.begin(), raw.end(), [](const auto& m) { return role_of(m) == "system"; });
    if (sys == raw.end()) sys = raw.insert(raw.begin(), ordered_json{{"role", "system"}});
    (*sys)["tools"] = tools;
  }
  const Messages context_raw = as_list(context_json, "context");
  Messages messages = merge_tool_messages(raw);
  Messages context = merge_tool_messages(context_raw);
  {
    Messages all = context;
    all.insert(all.end(), messages.begin(), messages.end());
    sort_tool_results(all);
    messages.assign(all.begin() + static_cast<std::ptrdiff_t>(context.size()), all.end());
    sort_tool_results(context);
  }
  Messages full = context;
  full.insert(full.end(), messages.begin(), messages.end());
  std::string prompt = options.add_bos && context.empty() ? bos : "";
  bool drop = options.drop_thinking;
  if (std::any_of(full.begin(), full.end(), [](const auto& m) { return truthy(m, "tools"); })) drop = false;
  std::size_t to_render = messages.size(), context_len = context.size();
  if (options.thinking_mode == ThinkingMode::thinking && drop) {
    full = drop_thinking_messages(full);
    to_render = full.size() - drop_thinking_messages(context).size();
    context_len = full.size() - to_render;
  }
  const Renderer renderer{full, options, drop, last_user_index(full)};
  for (std::size_t i = 0; i < to_render; ++i) prompt += renderer.render(static_cast<int>(i + context_len));
  return prompt;
}

}  // namespace tern::tokenizer
