// DeepSeek-V4's prompt format (it has no Jinja template), following DeepSeek's public
// encoding_dsv4.py rule by rule: system, user, developer, assistant (reasoning_content, tool calls
// as DSML blocks), tool results merged into user turns, latest_reminder, thinking and chat modes,
// reasoning effort, tools described to the model, dropping of old reasoning.
//
//   ChatOptions opt;                     // thinking mode, drop old reasoning, BOS
//   std::string prompt = encode_chat(messages, opt, tools);
//   auto ids = tokenizer.encode(prompt);  // special tokens in the prompt are recognised
//
// Messages are OpenAI-shaped JSON. Use nlohmann::ordered_json to keep key order: tool schemas and
// tool-call arguments are printed into the prompt as JSON in their given order (Python's
// json.dumps(..., ensure_ascii=False) layout).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace tern::tokenizer {

using ordered_json = nlohmann::ordered_json;

enum class ThinkingMode { chat, thinking };

// Which reasoning-effort prompts to use. flash_release: encoding_dsv4.py as released with
// DeepSeek-V4-Flash ("max" adds a prompt; "high" and none add nothing). ga_0731: the later
// revision ("low" or none adds nothing, "high" and "max" each add their own prompt).
enum class EffortPrompts { flash_release, ga_0731 };

struct ChatOptions {
  ThinkingMode thinking_mode = ThinkingMode::thinking;
  std::optional<std::string> reasoning_effort;  // only used in thinking mode
  EffortPrompts effort_prompts = EffortPrompts::flash_release;
  bool drop_thinking = true;  // drop reasoning_content of turns before the last user message
  bool add_bos = true;        // when there is no context
};

// `messages`: array of {role, content, ...}; roles system, user, assistant, tool, developer,
// latest_reminder. Assistant messages may carry reasoning_content and tool_calls (arguments as a
// JSON string or object); tool messages carry tool_call_id. `tools`: the request's OpenAI tools,
// attached to the first system message (one is added at the front when there is none).
// `context`: earlier messages whose encoding is already in the prompt (no BOS is added then).
// Throws tern::Error naming the message and field for input the reference would reject.
std::string encode_chat(const ordered_json& messages, const ChatOptions& options,
                        const ordered_json& tools = ordered_json(), const ordered_json& context = ordered_json());

// json.dumps(value, ensure_ascii=False) as Python prints it.
std::string python_json_dumps(const ordered_json& value);

// The prompt text of the special tokens the format uses.
namespace chat_tokens {
inline constexpr const char* bos = "<｜begin▁of▁sentence｜>";
inline constexpr const char* eos = "<｜end▁of▁sentence｜>";
inline constexpr const char* user = "<｜User｜>";
inline constexpr const char* assistant = "<｜Assistant｜>";
inline constexpr const char* latest_reminder = "<｜latest_reminder｜>";
inline constexpr const char* think_begin = "<think>";
inline constexpr const char* think_end = "</think>";
inline constexpr const char* dsml = "｜DSML｜";
}  // namespace chat_tokens

}  // namespace tern::tokenizer
