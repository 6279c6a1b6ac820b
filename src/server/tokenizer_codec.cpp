// TextCodec over tern_tokenizer. The chat prompt and the output parser here are the plain DeepSeek
// layout (BOS, system text, <｜User｜> / <｜Assistant｜> turns, </think> for non-thinking replies) until
// the tokenizer's V4 chat encoder and DSML tool-call parser replace them.
#include <algorithm>

#include "core/error.h"
#include "server/text_codec.h"
#include "tokenizer/tokenizer.h"

namespace tern::server {

namespace {

using tokenizer::Tokenizer;

// Splits "reasoning</think>content": everything before </think> is reasoning (thinking mode only).
class ThinkingParser : public OutputParser {
 public:
  explicit ThinkingParser(bool thinking) : in_reasoning_(thinking) {}
  ParsedDelta push(std::string_view text) override {
    ParsedDelta d;
    if (!in_reasoning_) {
      d.content = std::string(text);
      return d;
    }
    held_.append(text);
    const size_t end = held_.find(kEnd);
    if (end != std::string::npos) {
      d.reasoning = held_.substr(0, end);
      d.content = held_.substr(end + kEnd.size());
      held_.clear();
      in_reasoning_ = false;
      return d;
    }
    size_t keep = 0;  // a tail that may still become </think>
    for (size_t n = std::min(kEnd.size() - 1, held_.size()); n > 0; --n)
      if (held_.compare(held_.size() - n, n, kEnd, 0, n) == 0) { keep = n; break; }
    d.reasoning = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return d;
  }
  ParsedDelta finish() override {
    ParsedDelta d;
    (in_reasoning_ ? d.reasoning : d.content) = std::move(held_);
    held_.clear();
    return d;
  }

 private:
  static constexpr std::string_view kEnd = "</think>";
  bool in_reasoning_;
  std::string held_;
};

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(const std::string& path) : tok_(Tokenizer::from_file(path)) {
    const auto& s = tok_.special_ids();
    TERN_CHECK(s.bos && s.eos && s.user && s.assistant && s.think_end, path,
               ": the vocabulary lacks DeepSeek's chat tokens (BOS, EOS, User, Assistant, </think>)");
  }
  int64_t vocab_size() const override { return static_cast<int64_t>(tok_.vocab_size()); }
  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    return tok_.encode(text, add_special);
  }
  std::string decode(std::span<const int32_t> ids) const override { return tok_.decode(ids, true); }
  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size() || tok_.is_special(id)) return {};
    return std::string(tok_.token_bytes(id));
  }
  std::vector<int32_t> eos_ids() const override { return {*tok_.special_ids().eos}; }

  std::vector<int32_t> chat_prompt(const ChatRequest& r) const override {
    const auto& s = tok_.special_ids();
    std::vector<int32_t> ids{*s.bos};
    auto text = [&](const std::string& t) {
      const auto e = tok_.encode(t, false);
      ids.insert(ids.end(), e.begin(), e.end());
    };
    for (const auto& m : r.messages)
      if (m.role == "system" || m.role == "developer") text(m.content);
    for (const auto& m : r.messages) {
      if (m.role == "user" || m.role == "tool") {
        ids.push_back(*s.user);
        text(m.content);
      } else if (m.role == "assistant") {
        ids.push_back(*s.assistant);
        ids.push_back(*s.think_end);
        text(m.content);
        ids.push_back(*s.eos);
      }
    }
    ids.push_back(*s.assistant);
    ids.push_back(thinking(r) && s.think_begin ? *s.think_begin : *s.think_end);
    return ids;
  }

  std::unique_ptr<OutputParser> output_parser(const ChatRequest& r) const override {
    return std::make_unique<ThinkingParser>(thinking(r) && tok_.special_ids().think_begin.has_value());
  }

 private:
  static bool thinking(const ChatRequest& r) {
    if (r.thinking) return *r.thinking;
    return !r.reasoning_effort.empty() && r.reasoning_effort != "none";
  }
  Tokenizer tok_;
};

}  // namespace

std::unique_ptr<TextCodec> make_tokenizer_codec(const std::string& path) {
  return std::make_unique<TokenizerCodec>(path);
}

}  // namespace tern::server
