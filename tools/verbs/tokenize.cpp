// `tern tokenize` and `tern detokenize`: text <-> token ids with a tokenizer.json.
//
//   tern tokenize --tokenizer tokenizer.json --text "Hello"        -> 19923
//   echo '[{"role":"user","content":"Hi"}]' | tern tokenize --tokenizer t.json --chat --mode chat
//   tern tokenize --tokenizer t.json --jsonl < strings.jsonl       -> one JSON id array per line
//   tern detokenize --tokenizer t.json 19923 2                     -> Hello...
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"
#include "tools/verb.h"

namespace {

using tern::tokenizer::TokenId;
using tern::tokenizer::Tokenizer;

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

struct TokenizeArgs {
  std::string tokenizer, text, mode = "thinking", effort;
  bool add_special = false, chat = false, jsonl = false, json = false, show_prompt = false;
};

int run_tokenize(const TokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::from_file(a.tokenizer);
  if (a.jsonl) {
    for (std::string line; std::getline(std::cin, line);)
      std::cout << nlohmann::json(tok.encode(nlohmann::json::parse(line).get<std::string>(), a.add_special)).dump() << "\n";
    return 0;
  }
  std::string text = a.text.empty() ? read_stdin() : a.text;
  if (a.chat) {
    tern::tokenizer::ChatOptions opt;
    opt.thinking_mode = a.mode == "chat" ? tern::tokenizer::ThinkingMode::chat : tern::tokenizer::ThinkingMode::thinking;
    if (!a.effort.empty()) opt.reasoning_effort = a.effort;
    const auto request = tern::tokenizer::ordered_json::parse(text);
    const bool is_request = request.is_object();
    text = tern::tokenizer::encode_chat(is_request ? request.at("messages") : request, opt,
                                        is_request ? request.value("tools", tern::tokenizer::ordered_json()) : tern::tokenizer::ordered_json());
    if (a.show_prompt) std::cerr << text << "\n";
  }
  const std::vector<TokenId> ids = tok.encode(text, a.add_special);
  if (a.json) {
    std::cout << nlohmann::json(ids).dump() << "\n";
  } else {
    for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return 0;
}

struct DetokenizeArgs {
  std::string tokenizer;
  std::vector<TokenId> ids;
  bool skip_special = false;
};

int run_detokenize(const DetokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::from_file(a.tokenizer);
  std::vector<TokenId> ids = a.ids;
  if (ids.empty()) {
    std::string input = read_stdin();
    for (char& c : input)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream in(input);
    for (TokenId id; in >> id;) ids.push_back(id);
  }
  std::cout << tok.decode(ids, a.skip_special);
  return 0;
}

const bool registered_tokenize = tern::tools::register_verb(
    {"tokenize", "Encode text (or a chat, with --chat) to token ids", [](CLI::App& app) -> std::function<int()> {
       auto a = std::make_shared<TokenizeArgs>();
       app.add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
       app.add_option("--text", a->text, "text to encode (default: stdin)");
       app.add_flag("--add-special", a->add_special, "apply the post-processor (e.g. add BOS)");
       app.add_flag("--chat", a->chat, "input is OpenAI messages (or a request with messages/tools): encode as DeepSeek-V4");
       app.add_option("--mode", a->mode, "chat mode: thinking or chat")->check(CLI::IsMember({"thinking", "chat"}));
       app.add_option("--effort", a->effort, "reasoning_effort for --chat (high, max)");
       app.add_flag("--show-prompt", a->show_prompt, "print the chat prompt to stderr");
       app.add_flag("--jsonl", a->jsonl, "stdin holds one JSON string per line; print one id array per line");
       app.add_flag("--json", a->json, "print ids as a JSON array");
       return [a] { return run_tokenize(*a); };
     }});

const bool registered_detokenize = tern::tools::register_verb(
    {"detokenize", "Decode token ids to text", [](CLI::App& app) -> std::function<int()> {
       auto a = std::make_shared<DetokenizeArgs>();
       app.add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
       app.add_option("ids", a->ids, "token ids (default: read from stdin, spaces or a JSON array)");
       app.add_flag("--skip-special", a->skip_special, "leave out special tokens");
       return [a] { return run_detokenize(*a); };
     }});

}  // namespace
