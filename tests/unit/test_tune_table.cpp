// Kernel tuning tables: the choice among measured configurations, the file a device's table lives in, and
// the refusals (a malformed file, another device's file) that name the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backends/cuda/tune_table.h"
#include "core/error.h"

namespace tern::cuda {
namespace {

class TuneTableFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / cat("tern-tune-", getpid(), "-",
                                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories(dir_);
    std::ofstream(path(name)) << text;
  }
  std::filesystem::path dir_;
};

TEST(TuneTable, FastestIsTheSmallestTimeAndEveryTryIsKept) {
  const std::vector<int> candidates = {1, 2, 4, 8, 16};
  const std::vector<double> times = {60.0, 41.5, 38.25, 38.25, 52.0};
  int calls = 0;
  const TuneEntry e = TuneTable::fastest(candidates, [&](int c) {
    ++calls;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (candidates[i] == c) return times[i];
    return -1.0;
  });
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(e.choice, 4);  // the first of the two equal times
  EXPECT_DOUBLE_EQ(e.us, 38.25);
  ASSERT_EQ(e.tried.size(), 5u);
  EXPECT_EQ(e.tried[1], (std::pair<int, double>{2, 41.5}));
  EXPECT_THROW(TuneTable::fastest({}, [](int) { return 1.0; }), Error);
}

TEST_F(TuneTableFiles, SavedTablesLoadAsTheyWere) {
  TuneTable t("NVIDIA H200|sm_90|132 SMs");
  t.put("linear_stream.v1/fp8_block/out=1024/in=4096/rows=1024", {8, 41.25, {{1, 60.5}, {8, 41.25}}});
  t.put("linear_stream.v1/mxfp4/out=4096/in=2048/rows=4096", {2, 12.0, {{2, 12.0}}});
  const std::string file = path("nested/folder/tune.json");
  t.save(file);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "nested/folder"), {}), 1);  // no temporary left
  const TuneTable back = TuneTable::load(file, t.device());
  ASSERT_EQ(back.entries().size(), 2u);
  const TuneEntry* e = back.find("linear_stream.v1/fp8_block/out=1024/in=4096/rows=1024");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->choice, 8);
  EXPECT_DOUBLE_EQ(e->us, 41.25);
  EXPECT_EQ(e->tried, (std::vector<std::pair<int, double>>{{1, 60.5}, {8, 41.25}}));
  EXPECT_EQ(back.find("linear_stream.v1/fp8_block/out=1/in=1/rows=1"), nullptr);
}

TEST_F(TuneTableFiles, AMissingFileIsAnEmptyTable) {
  const TuneTable t = TuneTable::load(path("none.json"), "dev");
  EXPECT_TRUE(t.entries().empty());
  EXPECT_EQ(t.device(), "dev");
}

TEST_F(TuneTableFiles, MalformedFilesAndOtherDevicesAreRefusedNamingTheFile) {
  const auto refused = [&](const std::string& name, const std::string& text, const std::string& says) {
    write(name, text);
    try {
      TuneTable::load(path(name), "NVIDIA H200|sm_90|132 SMs");
      ADD_FAILURE() << name << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path(name)), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  };
  refused("text.json", "not json", "not a tern tuning table");
  refused("array.json", "[1, 2]", "not a tern tuning table");
  refused("entry.json", R"({"device": "NVIDIA H200|sm_90|132 SMs", "entries": {"k": {"choice": "x"}}})", "entry \"k\"");
  refused("pair.json", R"({"device": "NVIDIA H200|sm_90|132 SMs", "entries": {"k": {"choice": 1, "us": 2, "tried": [[1]]}}})",
          "entry \"k\"");
  refused("other.json", R"({"device": "NVIDIA H100|sm_90|132 SMs", "entries": {}})", "measured on \"NVIDIA H100");
}

TEST(TuneTable, DefaultPathFollowsTheCacheVariables) {
  const auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return std::pair<bool, std::string>(v != nullptr, v ? v : "");
  };
  const auto restore = [](const char* name, const std::pair<bool, std::string>& v) {
    if (v.first)
      setenv(name, v.second.c_str(), 1);
    else
      unsetenv(name);
  };
  const auto tern = saved("TERN_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME");
  setenv("TERN_CACHE_DIR", "/somewhere/cache", 1);
  EXPECT_EQ(default_tune_path("NVIDIA H200|sm_90|132 SMs"), "/somewhere/cache/tune-NVIDIA-H200-sm-90-132-SMs.json");
  unsetenv("TERN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(default_tune_path("d"), "/xdg/tern/tune-d.json");
  restore("TERN_CACHE_DIR", tern);
  restore("XDG_CACHE_HOME", xdg);
}

}  // namespace
}  // namespace tern::cuda
