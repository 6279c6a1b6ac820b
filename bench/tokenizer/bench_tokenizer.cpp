// Encode throughput of tern's tokenizer on one thread: reads a corpus (one JSON string per line),
// encodes it repeatedly for at least --seconds, prints MB/s. bench/tokenizer/run.sh runs it beside
// Hugging Face tokenizers on the same corpus and core.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER_JSON CORPUS_JSONL [SECONDS]\n");
    return 2;
  }
  const auto tok = tern::tokenizer::Tokenizer::from_file(argv[1]);
  const double seconds = argc > 3 ? std::atof(argv[3]) : 3.0;
  std::vector<std::string> corpus;
  std::size_t bytes = 0;
  std::ifstream in(argv[2]);
  for (std::string line; std::getline(in, line);) {
    corpus.push_back(nlohmann::json::parse(line).get<std::string>());
    bytes += corpus.back().size();
  }
  std::size_t tokens = 0, rounds = 0;
  for (const auto& s : corpus) tokens += tok.encode(s).size();  // warm-up (as HF's cache is warm)
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < seconds) {
    for (const auto& s : corpus) tokens += tok.encode(s).size();
    ++rounds;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("tern: %.2f MB/s (%zu rounds of %.2f MB, %zu strings)\n", rounds * bytes / elapsed / 1e6, rounds,
              bytes / 1e6, corpus.size());
  return tokens == 0;
}
