// Shared helpers of the model-loading tests: scratch directories, raw file writing, error matching.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/error.h"

namespace tern::model::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at scope exit.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "tern-" + tag + "-" + std::to_string(::getpid());
    if (info) name += std::string("-") + info->test_suite_name() + "." + info->name();
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// 8-byte little-endian length + header + data bytes.
inline std::string safetensors_bytes(const std::string& header, const std::string& data, uint64_t length_override = 0) {
  const uint64_t n = length_override ? length_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Runs fn, expecting a tern::Error whose message contains every part.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nwanted: " << p;
  }
}

}  // namespace tern::model::testing
