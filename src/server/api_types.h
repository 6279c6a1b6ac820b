// The OpenAI-compatible requests as typed values (schemas_parse.cpp parses and checks the JSON into
// these). The error a handler answers with is net::ApiError (net/openai.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace tern::server {

// Fields shared by /v1/completions and /v1/chat/completions.
struct GenerationParams {
  std::string model;
  engine::SamplingParams sampling;
  engine::StopParams stop;
  bool max_tokens_given = false;
  int n = 1;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // completions: logprobs=k sets this and top_logprobs
  std::string user;
};

struct CompletionRequest {
  GenerationParams params;
  std::vector<std::string> text_prompts;           // prompt as strings
  std::vector<std::vector<int32_t>> token_prompts;  // or as token ids
  bool echo = false;
};

struct ToolCall {
  std::string id, name, arguments;  // arguments: JSON text
};

struct ChatMessage {
  std::string role;  // system, user, assistant, tool, developer
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;
  std::string name;
};

struct ToolSpec {
  std::string name, description;
  std::string parameters;  // JSON schema text
};

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
  std::string tool_choice = "auto";  // auto, none, required, or a function name
  std::optional<bool> thinking;      // chat_template_kwargs.thinking
  std::string reasoning_effort;      // low, medium, high ("" = not given)
  // The request's messages and tools as JSON text in their original key order, for the chat encoder
  // (tool schemas and arguments are printed into the prompt as given).
  std::string messages_json, tools_json;
};

struct TokenizeRequest {
  std::string model;
  std::string prompt;                 // or messages
  std::optional<ChatRequest> chat;
  bool add_special_tokens = true;
};

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};

}  // namespace tern::server
