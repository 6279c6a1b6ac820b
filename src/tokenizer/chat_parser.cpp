#include "tokenizer/chat_parser.h"

#include <array>
#include <optional>

#include "core/error.h"

namespace tern::tokenizer {
namespace {

using namespace chat_tokens;

const std::string kDsml = dsml;
const std::string kToolCallsStart = "\n\n<" + kDsml + "tool_calls";
const std::string kToolCallsEnd = "</" + kDsml + "tool_calls>";
const std::string kInvoke = "<" + kDsml + "invoke";
const std::string kInvokeEnd = "</" + kDsml + "invoke";
const std::string kParam = "<" + kDsml + "parameter";
const std::string kParamEnd = "/" + kDsml + "parameter";
// Special tokens that may not appear in content or reasoning_content.
const std::array<std::string, 5> kForbidden = {bos, eos, think_begin, think_end, kDsml};

struct Found {
  std::size_t pos;
  const std::string* stop;
};

std::optional<Found> find_first(std::string_view text, std::initializer_list<const std::string*> stops) {
  std::optional<Found> best;
  for (const std::string* s : stops) {
    const std::size_t pos = text.find(*s);
    if (pos != std::string_view::npos && (!best || pos < best->pos)) best = Found{pos, s};
  }
  return best;
}

// Length of the longest end of `text` that could begin one of `markers`.
std::size_t partial_marker(std::string_view text, std::initializer_list<const std::string*> markers) {
  std::size_t keep = 0;
  for (const std::string* m : markers) {
    for (std::size_t len = std::min(text.size(), m->size() - 1); len > keep; --len) {
      if (text.substr(text.size() - len) == std::string_view(*m).substr(0, len)) {
        keep = len;
        break;
      }
    }
  }
  return keep;
}

void check_no_special(std::string_view text) {
  for (const std::string& s : kForbidden)
    TERN_CHECK(text.find(s) == std::string_view::npos, "generated text is malformed: special token '", s,
               "' inside content");
}

// `^\s*name="(.*?)">\n$` of the reference.
std::string invoke_name(std::string_view part) {
  std::size_t i = 0;
  while (i < part.size() && (part[i] == ' ' || part[i] == '\t' || part[i] == '\n' || part[i] == '\r')) ++i;
  const std::string_view rest = part.substr(i);
  for (const std::string_view end : {std::string_view("\">\n"), std::string_view("\">\n\n")}) {
    if (rest.starts_with("name=\"") && rest.size() >= 6 + end.size() && rest.ends_with(end))
      return std::string(rest.substr(6, rest.size() - 6 - end.size()));
  }
  fail("tool call format error: bad invoke name in '", part, "'");
}

// `^ name="(.*?)" string="(true|false)">(.*?)<$` of the reference.
std::pair<std::string, std::pair<std::string, bool>> parameter(std::string_view part) {
  TERN_CHECK(part.starts_with(" name=\"") && part.ends_with("<"), "tool call format error: bad parameter '", part, "'");
  const std::size_t t = part.find("\" string=\"true\">", 7);
  const std::size_t f = part.find("\" string=\"false\">", 7);
  const std::size_t at = std::min(t, f);
  TERN_CHECK(at != std::string_view::npos, "tool call format error: parameter without string=\"true|false\": '", part, "'");
  const bool is_string = at == t;
  const std::size_t value_at = at + (is_string ? 16 : 17);
  TERN_CHECK(value_at <= part.size() - 1, "tool call format error: bad parameter '", part, "'");
  return {std::string(part.substr(7, at - 7)), {std::string(part.substr(value_at, part.size() - 1 - value_at)), is_string}};
}

}  // namespace

ChatStreamParser::ChatStreamParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::thinking ? State::reasoning : State::content) {}

ChatStreamParser::Delta ChatStreamParser::push(std::string_view text) {
  buffer_.append(text);
  Delta delta;
  run(delta, false);
  return delta;
}

ChatStreamParser::Delta ChatStreamParser::finish() {
  Delta delta;
  run(delta, true);
  return delta;
}

void ChatStreamParser::run(Delta& delta, bool at_end) {
  while (step(delta, at_end)) {
  }
}

void ChatStreamParser::emit_text(Delta& delta, std::string_view text) {
  check_no_special(text);
  (state_ == State::reasoning ? delta.reasoning_content : delta.content).append(text);
}

bool ChatStreamParser::step(Delta& delta, bool at_end) {
  switch (state_) {
    case State::reasoning:
    case State::content: return step_text(delta, at_end);
    case State::tool_block: return step_block(delta, at_end);
    case State::after_block: {
      const std::size_t pos = buffer_.find(eos);
      if (pos != std::string::npos) {
        TERN_CHECK(pos == 0, "generated text is malformed: unexpected content after tool calls");
        buffer_.erase(0, std::string_view(eos).size());
        state_ = State::done;
        return true;
      }
      TERN_CHECK(std::string_view(eos).starts_with(buffer_) && !(at_end && !buffer_.empty()),
                 "generated text is malformed: unexpected content after tool calls");
      return false;
    }
    case State::done:
      TERN_CHECK(buffer_.empty(), "generated text is malformed: text after the end-of-sentence token");
      return false;
  }
  return false;
}

bool ChatStreamParser::step_text(Delta& delta, bool at_end) {
  const bool reasoning = state_ == State::reasoning;
  const std::string think_close = think_end, end_of_sentence = eos;
  const std::string& stop_a = reasoning ? think_close : end_of_sentence;
  if (const auto found = find_first(buffer_, {&stop_a, &kToolCallsStart})) {
    emit_text(delta, std::string_view(buffer_).substr(0, found->pos));
    buffer_.erase(0, found->pos + found->stop->size());
    if (reasoning) {
      TERN_CHECK(found->stop == &stop_a, "generated text is malformed: tool calls before </think>");
      state_ = State::content;
    } else {
      state_ = found->stop == &stop_a ? State::done : State::tool_block;
      block_ = Block::before_invoke;
    }
    return true;
  }
  std::size_t keep = 0;
  if (!at_end) {
    const std::string f0 = kForbidden[0], f1 = kForbidden[1], f2 = kForbidden[2], f3 = kForbidden[3], f4 = kForbidden[4];
    keep = partial_marker(buffer_, {&stop_a, &kToolCallsStart, &f0, &f1, &f2, &f3, &f4});
  }
  emit_text(delta, std::string_view(buffer_).substr(0, buffer_.size() - keep));
  buffer_.erase(0, buffer_.size() - keep);
  return false;
}

bool ChatStreamParser::step_block(Delta& delta, bool at_end) {
  const auto need = [&](std::initializer_list<const std::string*> stops) -> std::optional<Found> {
    auto found = find_first(buffer_, stops);
    TERN_CHECK(found || !at_end, "generated text is malformed: the tool call block is incomplete");
    return found;
  };
  const auto finish_call = [&](Delta& d) {
    std::string args = "{";
    for (std::size_t i = 0; i < call_args_.size(); ++i) {
      const auto& [key, value] = call_args_[i];
      if (i) args += ", ";
      args += python_json_dumps(key) + ": " + (value.second ? python_json_dumps(value.first) : value.first);
    }
    d.tool_calls.push_back({call_name_, args + "}"});
    block_ = Block::before_invoke;
  };
  std::optional<Found> found;
  switch (block_) {
    case Block::before_invoke:
    case Block::after_param:
      if (!(found = block_ == Block::before_invoke ? need({&kInvoke, &kToolCallsEnd}) : need({&kParam, &kInvokeEnd}))) return false;
      TERN_CHECK(std::string_view(buffer_).substr(0, found->pos) == ">\n", "tool call format error: expected '>\\n' but got '",
                 buffer_.substr(0, found->pos), "'");
      if (found->stop == &kToolCallsEnd) state_ = State::after_block;
      else if (found->stop == &kInvoke) block_ = Block::name;
      else if (found->stop == &kParam) block_ = Block::param;
      else finish_call(delta);
      break;
    case Block::name:
      if (!(found = need({&kParam, &kInvokeEnd}))) return false;
      call_name_ = invoke_name(std::string_view(buffer_).substr(0, found->pos));
      call_args_.clear();
      if (found->stop == &kParam) block_ = Block::param; else finish_call(delta);
      break;
    case Block::param: {
      if (!(found = need({&kParamEnd}))) return false;
      auto kv = parameter(std::string_view(buffer_).substr(0, found->pos));
      for (const auto& existing : call_args_)
        TERN_CHECK(existing.first != kv.first, "tool call format error: duplicate parameter name '", kv.first, "'");
      call_args_.push_back(std::move(kv));
      block_ = Block::after_param;
      break;
    }
  }
  buffer_.erase(0, found->pos + found->stop->size());
  return true;
}

ParsedMessage parse_completion(std::string_view text, ThinkingMode mode) {
  ChatStreamParser parser(mode);
  ParsedMessage out;
  const auto add = [&out](const ChatStreamParser::Delta& d) {
    out.reasoning_content += d.reasoning_content;
    out.content += d.content;
    out.tool_calls.insert(out.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  add(parser.push(text));
  add(parser.finish());
  out.finished = parser.finished();
  return out;
}

ordered_json ParsedMessage::to_json() const {
  ordered_json calls = ordered_json::array();
  for (const ToolCall& c : tool_calls)
    calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return {{"role", "assistant"}, {"content", content}, {"reasoning_content", reasoning_content}, {"tool_calls", calls}};
}

}  // namespace tern::tokenizer
