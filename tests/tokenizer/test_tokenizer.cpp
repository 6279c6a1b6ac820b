// Unit tests of the tokenizer library on a small synthetic byte-level BPE (no Python needed).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tern::tokenizer {
namespace {

using nlohmann::json;

// 256 byte tokens (ids 0..255), merges h+e, he+l, l+o, ' '+w, and two added tokens.
json tiny_spec() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::from_bytes(std::string(1, static_cast<char>(b)))] = b;
  vocab["he"] = 256;
  vocab["hel"] = 257;
  vocab["lo"] = 258;
  vocab[byte_level::from_bytes(" w")] = 259;
  json merges = json::array({"h e", json::array({"he", "l"}), "l o", byte_level::from_bytes(" ") + " w"});
  return {
      {"version", "1.0"},
      {"added_tokens",
       json::array({{{"id", 260}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
                    {{"id", 261}, {"content", "[T]"}, {"special", false}, {"normalized", true}, {"lstrip", true}, {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

Tokenizer tiny() { return Tokenizer::from_json(tiny_spec().dump()); }

std::string error_of(const json& spec) {
  try {
    Tokenizer::from_json(spec.dump(), "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Bpe, MergesByRank) {
  const Tokenizer tok = tiny();
  EXPECT_EQ(tok.encode("hello"), (std::vector<TokenId>{257, 258}));  // hel lo
  EXPECT_EQ(tok.encode("hello world").size(), 7u);  // hel lo | " w" o r l d
  EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");
}

TEST(Bpe, LongWordUsesHeapPathWithSameResult) {
  const Tokenizer tok = tiny();
  std::string word;
  for (int i = 0; i < 100; ++i) word += "hello";
  const auto ids = tok.encode(word);
  ASSERT_EQ(ids.size(), 200u);
  for (std::size_t i = 0; i < ids.size(); i += 2) EXPECT_EQ(ids[i], 257);
}

TEST(AddedTokens, SpecialMatchedAndSkippedOnRequest) {
  const Tokenizer tok = tiny();
  const auto ids = tok.encode("hel<|end|>lo");
  EXPECT_EQ(ids, (std::vector<TokenId>{257, 260, 258}));
  EXPECT_EQ(tok.decode(ids), "hel<|end|>lo");
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), "hello");
  EXPECT_TRUE(tok.is_special(260));
  EXPECT_FALSE(tok.is_special(261));
  EXPECT_EQ(tok.token_to_id("<|end|>"), 260);
}

TEST(AddedTokens, LstripRstripAbsorbWhitespace) {
  const Tokenizer tok = tiny();
  EXPECT_EQ(tok.encode("lo  [T]  lo"), (std::vector<TokenId>{258, 261, 258}));
}

TEST(Errors, InvalidUtf8IsRejectedWithOffset) {
  const Tokenizer tok = tiny();
  try {
    tok.encode(std::string("ab\xC3(", 4));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
  }
}

TEST(Errors, MalformedTokenizerJsonNamesThePath) {
  json spec = tiny_spec();
  spec["model"]["merges"][2] = "l zz";
  EXPECT_NE(error_of(spec).find("model.merges[2]"), std::string::npos) << error_of(spec);
  EXPECT_NE(error_of(spec).find("bad.json"), std::string::npos);
  spec = tiny_spec();
  spec["pre_tokenizer"]["type"] = "Metaspace";
  EXPECT_NE(error_of(spec).find("pre_tokenizer.type"), std::string::npos) << error_of(spec);
  spec = tiny_spec();
  spec["added_tokens"][1]["id"] = "x";
  EXPECT_NE(error_of(spec).find("added_tokens[1].id"), std::string::npos) << error_of(spec);
  spec = tiny_spec();
  spec["model"].erase("vocab");
  EXPECT_NE(error_of(spec).find("model.vocab"), std::string::npos) << error_of(spec);
  EXPECT_NE(error_of(json::array()).find("expected a JSON object"), std::string::npos);
  try {
    Tokenizer::from_json("{not json", "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: not valid JSON"), std::string::npos);
  }
}

}  // namespace
}  // namespace tern::tokenizer

namespace tern::tokenizer {
namespace {

TEST(IncrementalDecoder, HoldsSplitCharactersAndMatchesOneShot) {
  const Tokenizer tok = tiny();
  const std::string text = "é🙂x";
  const auto ids = tok.encode(text);  // byte tokens: each splits a character
  IncrementalDecoder dec(tok);
  std::string joined;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string out = dec.push(ids[i]);
    EXPECT_EQ(unicode::find_invalid_utf8(out), std::string_view::npos);
    joined += out;
  }
  joined += dec.finish();
  EXPECT_EQ(joined, text);
  IncrementalDecoder cut(tok);
  EXPECT_EQ(cut.push(0xF0), "");
  EXPECT_EQ(cut.pending_bytes(), 1u);
  EXPECT_EQ(cut.finish(), "\xEF\xBF\xBD");
}

TEST(Unicode, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(unicode::lossy("a\xF0\x9F\x99x"), "a\xEF\xBF\xBDx");
  EXPECT_EQ(unicode::lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Regex, OnigurumaMeaningsOfShorthands) {
  Regex re(R"(\s+)");
  std::vector<std::pair<std::size_t, std::size_t>> m;
  re.for_each_match("a\xE1\xA0\x8E" "b \x0B c", [&](std::size_t b, std::size_t e) { m.emplace_back(b, e); });
  ASSERT_EQ(m.size(), 1u);  // U+180E is not White_Space in Oniguruma
  EXPECT_EQ(m[0], (std::pair<std::size_t, std::size_t>{5, 8}));
  EXPECT_THROW(Regex("[[a]]"), Error);
}

TEST(PreTokenizer, SplitBehaviors) {
  const std::vector<Cut> cuts = {{0, 1, false}, {1, 2, true}, {2, 3, true}, {3, 5, false}};
  const auto run = [&](SplitBehavior b) {
    std::vector<Span> out;
    apply_behavior(cuts, b, out);
    std::vector<std::pair<int, int>> r;
    for (const Span& s : out) r.emplace_back(s.begin, s.end);
    return r;
  };
  using V = std::vector<std::pair<int, int>>;
  EXPECT_EQ(run(SplitBehavior::isolated), (V{{0, 1}, {1, 2}, {2, 3}, {3, 5}}));
  EXPECT_EQ(run(SplitBehavior::removed), (V{{0, 1}, {3, 5}}));
  EXPECT_EQ(run(SplitBehavior::contiguous), (V{{0, 1}, {1, 3}, {3, 5}}));
  EXPECT_EQ(run(SplitBehavior::merged_with_previous), (V{{0, 2}, {2, 3}, {3, 5}}));
  EXPECT_EQ(run(SplitBehavior::merged_with_next), (V{{0, 1}, {1, 2}, {2, 5}}));
}

}  // namespace
}  // namespace tern::tokenizer
