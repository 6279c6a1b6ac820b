// The PDL rule of the CUDA backend (src/backends/cuda/kernels/launch.cuh), checked on the sources so that
// CPU-only CI catches a kernel that would carry the programmatic-launch attribute without waiting:
//   - every kernel calls grid_dependency_wait() (or pdl_prologue(), which starts with it), before any
//     `return` of its body;
//   - a kernel whose first statement is not the wait says what it does before it ("before the wait");
//   - no launch bypasses tern::cuda::launch: no <<<>>> and no cudaLaunchKernel* call outside launch.cuh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

// The text with comments blanked (same length, newlines kept); string and character literals are kept.
std::string strip_comments(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '"' || s[i] == '\'') {
      const char q = s[i];
      for (++i; i < s.size() && s[i] != q; ++i)
        if (s[i] == '\\') ++i;
    } else if (s.compare(i, 2, "//") == 0) {
      for (; i < s.size() && s[i] != '\n'; ++i) out[i] = ' ';
    } else if (s.compare(i, 2, "/*") == 0) {
      const size_t end = s.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? s.size() : end + 2;
      for (; i < stop; ++i)
        if (out[i] != '\n') out[i] = ' ';
      --i;
    }
  }
  return out;
}

// Index just past the bracket group opening at s[open] (s[open] is `o`), or npos.
size_t skip_group(const std::string& s, size_t open, char o, char c) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == o) ++depth;
    if (s[i] == c && --depth == 0) return i + 1;
  }
  return std::string::npos;
}

size_t skip_space(const std::string& s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Position of the word `w` (not part of a longer identifier) in s[from, to), or npos.
size_t find_word(const std::string& s, const std::string& w, size_t from, size_t to) {
  for (size_t at = s.find(w, from); at != std::string::npos && at < to; at = s.find(w, at + 1)) {
    const bool left = at == 0 || !is_word_char(s[at - 1]);
    const bool right = at + w.size() >= s.size() || !is_word_char(s[at + w.size()]);
    if (left && right) return at;
  }
  return std::string::npos;
}

struct Kernel {
  std::string file, name;
  std::string body;      // without comments, from just past `{` to just before the matching `}`
  std::string raw_body;  // the same range with its comments
};

// Every kernel definition (`__global__ ... name(...) {`) in one source text.
std::vector<Kernel> kernels_in(const std::string& file, const std::string& raw) {
  std::vector<Kernel> out;
  const std::string s = strip_comments(raw);
  for (size_t at = find_word(s, "__global__", 0, s.size()); at != std::string::npos;
       at = find_word(s, "__global__", at + 1, s.size())) {
    size_t i = at + std::string("__global__").size();
    std::string name;
    for (;;) {  // the identifier before the parameter list, past `void` and __launch_bounds__(...)
      i = skip_space(s, i);
      size_t j = i;
      while (j < s.size() && is_word_char(s[j])) ++j;
      const std::string word = s.substr(i, j - i);
      i = skip_space(s, j);
      if (word == "__launch_bounds__") {
        i = skip_group(s, i, '(', ')');
        continue;
      }
      if (word == "void") continue;
      name = word;
      break;
    }
    const size_t params_end = skip_group(s, i, '(', ')');
    const size_t brace = params_end == std::string::npos ? s.size() : skip_space(s, params_end);
    if (brace >= s.size() || s[brace] != '{') continue;  // a declaration
    const size_t end = skip_group(s, brace, '{', '}');
    if (end == std::string::npos) {
      ADD_FAILURE() << file << ": " << name << ": no end to its body";
      continue;
    }
    out.push_back({file, name, s.substr(brace + 1, end - brace - 2), raw.substr(brace + 1, end - brace - 2)});
  }
  return out;
}

// Every kernel of the backend's kernel sources.
std::vector<Kernel> backend_kernels() {
  std::vector<Kernel> out;
  for (const auto& entry : fs::directory_iterator(fs::path(TERN_SOURCE_DIR) / "src/backends/cuda/kernels")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh") continue;
    for (Kernel& k : kernels_in(entry.path().filename().string(), read_file(entry.path())))
      out.push_back(std::move(k));
  }
  return out;
}

// How one kernel breaks PDL RULES 1 and 2 (launch.cuh); empty when it keeps them.
std::vector<std::string> violations(const Kernel& k) {
  std::vector<std::string> v;
  const std::string& b = k.body;
  const size_t wait =
      std::min(find_word(b, "grid_dependency_wait", 0, b.size()), find_word(b, "pdl_prologue", 0, b.size()));
  if (wait == std::string::npos) {
    v.push_back("never calls grid_dependency_wait() (PDL RULE 1)");
    return v;
  }
  const size_t ret = find_word(b, "return", 0, b.size());
  if (ret != std::string::npos && ret < wait)
    v.push_back("may return before grid_dependency_wait() (PDL RULE 1)");
  std::string raw = k.raw_body;
  for (char& c : raw) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t first = skip_space(b, 0);
  if (first != wait && raw.find("before the wait") == std::string::npos)
    v.push_back("works before its wait without a \"before the wait\" comment saying what (PDL RULE 2)");
  return v;
}

TEST(PdlRule, EveryKernelWaitsFirstOrSaysWhatComesBefore) {
  const std::vector<Kernel> ks = backend_kernels();
  ASSERT_GE(ks.size(), 40u) << "did the scan find the kernels under " << TERN_SOURCE_DIR
                            << "/src/backends/cuda/kernels?";
  for (const Kernel& k : ks)
    for (const std::string& why : violations(k))
      ADD_FAILURE() << k.file << ": " << k.name << " " << why << " (launch.cuh)";
}

TEST(PdlRule, EveryLaunchGoesThroughTheHelper) {
  int files = 0;
  for (const auto& entry :
       fs::recursive_directory_iterator(fs::path(TERN_SOURCE_DIR) / "src/backends/cuda")) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cu" && ext != ".cuh" && ext != ".cpp" && ext != ".h") continue;
    ++files;
    const std::string s = strip_comments(read_file(entry.path()));
    EXPECT_EQ(s.find("<<<"), std::string::npos)
        << entry.path() << ": a <<<>>> launch; use tern::cuda::launch (launch.cuh, PDL RULE 3)";
    if (entry.path().filename() == "launch.cuh") continue;
    for (const char* api : {"cudaLaunchKernel", "cudaLaunchKernelEx", "cudaLaunchKernelExC",
                            "cudaLaunchCooperativeKernel", "cuLaunchKernel", "cuLaunchKernelEx"})
      EXPECT_EQ(find_word(s, api, 0, s.size()), std::string::npos)
          << entry.path() << ": calls " << api << "; use tern::cuda::launch (launch.cuh, PDL RULE 3)";
  }
  EXPECT_GE(files, 30);
}

// The checks see the rule broken: in comments nothing counts, a kernel that returns before its wait, one that
// never waits, one that works first without saying what; and they pass the three shapes the backend uses.
TEST(PdlRule, TheChecksSeeTheRuleBroken) {
  EXPECT_EQ(strip_comments("a // x <<<\nb /* y */ c \"//\""), "a         \nb         c \"//\"");
  EXPECT_EQ(find_word("return_value; returns; return;", "return", 0, 30), 23u);
  const std::string src = R"(
// __global__ void commented_out(int) {}
__global__ void early(int n) { if (n == 0) return; grid_dependency_wait(); }
template <int N> __global__ void __launch_bounds__(N * 32, 1) never(int* p) { p[0] = N; }
__global__ void silent(const int* w) { int a = w[0]; grid_dependency_wait(); }
__global__ void declared(int);
__global__ void first(int* p) { pdl_prologue(); if (!p) return; p[0] = 1; }
__global__ void first_wait(int* p) {
  // not a statement
  grid_dependency_wait(); }
__global__ void __launch_bounds__(128) said(const int* w, int* p) {
  const int a = w[0];  // before the wait: only the weights
  grid_dependency_wait();
  if (a) return;
})";
  const std::vector<Kernel> ks = kernels_in("test.cu", src);
  ASSERT_EQ(ks.size(), 6u);
  const char* names[] = {"early", "never", "silent", "first", "first_wait", "said"};
  const size_t broken[] = {2, 1, 1, 0, 0, 0};  // early: returns first, and works first unsaid
  for (size_t i = 0; i < ks.size(); ++i) {
    EXPECT_EQ(ks[i].name, names[i]);
    EXPECT_EQ(violations(ks[i]).size(), broken[i]) << ks[i].name;
  }
}

}  // namespace
