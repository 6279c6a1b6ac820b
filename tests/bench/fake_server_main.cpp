// The test server as a process (for end-to-end tests of the `tern` command): prints its port, then
// serves until killed. Usage: fake_openai_server [ttft_us itl_us [spec]]; with `spec`, GET /metrics
// serves tern's speculative-decoding counters, growing by 10 verify rounds of 3 draft tokens (20
// accepted: 9 / 7 / 4 at positions 0 / 1 / 2) per completion request.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "fake_server.h"

int main(int argc, char** argv) {
  tern::bench::testing::FakeServerOptions options;
  if (argc >= 3) {
    options.ttft = std::chrono::microseconds(std::atol(argv[1]));
    options.itl = std::chrono::microseconds(std::atol(argv[2]));
  }
  if (argc >= 4 && std::string(argv[3]) == "spec")
    options.metrics = [](int seen) {
      auto series = [seen](const std::string& name, const std::string& labels, int per_request) {
        return "tern:spec_decode_num_" + name + "{model_name=\"ok\"" + labels + "} " +
               std::to_string(per_request * seen) + "\n";
      };
      return series("drafts_total", "", 10) + series("draft_tokens_total", "", 30) +
             series("accepted_tokens_total", "", 20) +
             series("accepted_tokens_per_pos_total", ",position=\"0\"", 9) +
             series("accepted_tokens_per_pos_total", ",position=\"1\"", 7) +
             series("accepted_tokens_per_pos_total", ",position=\"2\"", 4);
    };
  tern::bench::testing::FakeServer server(options);
  std::printf("%u\n", server.port());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}
