// The test server as a process (for end-to-end tests of the `tern` command): prints its port, then
// serves until killed. Usage: fake_openai_server [ttft_us itl_us]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "fake_server.h"

int main(int argc, char** argv) {
  tern::bench::testing::FakeServerOptions options;
  if (argc >= 3) {
    options.ttft = std::chrono::microseconds(std::atol(argv[1]));
    options.itl = std::chrono::microseconds(std::atol(argv[2]));
  }
  tern::bench::testing::FakeServer server(options);
  std::printf("%u\n", server.port());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}
