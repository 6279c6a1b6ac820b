// The GPU transfer backends between two processes, as prefill and decode servers use them: this process
// lands device memory, a child (this binary with --send) writes into it from its own device memory, and
// the bytes are checked. Bandwidth is reported against the device's own copy bandwidth (cudaMemcpy
// device to device in one process, same size). Without a GPU every test is SKIPPED (never passed); NCCL
// needs two GPUs (one rank per GPU) and libnccl.so.2.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "transfer/cuda_ipc_backend.h"
#ifdef TERN_HAVE_NCCL
#include "transfer/nccl_backend.h"
#endif

extern char** environ;

namespace tern::transfer {
namespace {

using Clock = std::chrono::steady_clock;

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::unique_ptr<Backend> make(const std::string& kind, boost::asio::io_context& io, int device) {
  if (kind == "cuda-ipc") return make_cuda_ipc_backend(io, {device});
#ifdef TERN_HAVE_NCCL
  if (kind == "nccl") return make_nccl_backend(io, {device, std::chrono::milliseconds(60000)});
#endif
  throw Error(cat("no backend ", kind));
}

uint8_t pattern_byte(size_t i, int seed) { return static_cast<uint8_t>((i * 2654435761u + static_cast<size_t>(seed)) >> 7); }

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(pattern_byte(i, seed));
  return v;
}

// The child: --send <backend> <device> <descriptor> <bytes> <seed> <timing file>. Writes the pattern from
// device memory, in two segments (as a state of several regions would go); records the send's seconds.
// cuda-ipc sends twice: the second time the handle is already open, as for a server's later transfers
// to a reused landing (both times are recorded).
int send_main(char** argv) {
  const std::string kind = argv[2], descriptor = argv[4], timing = argv[7];
  const int device = std::stoi(argv[3]), seed = std::stoi(argv[6]);
  const size_t bytes = std::stoull(argv[5]);
  try {
    boost::asio::io_context io;
    auto backend = make(kind, io, device);
    const auto host = pattern(bytes, seed);
    cudaSetDevice(device);
    void* src = nullptr;
    TERN_CHECK(cudaMalloc(&src, bytes) == cudaSuccess, "cudaMalloc");
    TERN_CHECK(cudaMemcpy(src, host.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess, "cudaMemcpy");
    const size_t half = bytes / 2;
    const auto* p = static_cast<const std::byte*>(src);
    // The backend posts completion from its worker thread: keep the io_context from running out of work
    // (a run_one() with nothing queued would stop it, and the posted completion would never run).
    auto work = boost::asio::make_work_guard(io);
    std::ofstream times(timing);
    for (int round = 0; round < (kind == "cuda-ipc" ? 2 : 1); ++round) {
      std::string result = "pending";
      const auto t0 = Clock::now();
      backend->send(descriptor, {Segment(p, half), Segment(p + half, bytes - half)}, [&](std::string e) { result = std::move(e); });
      while (result == "pending") io.run_one();
      times << std::chrono::duration<double>(Clock::now() - t0).count() << "\n";
      if (!result.empty()) {
        std::fprintf(stderr, "send failed: %s\n", result.c_str());
        return 1;
      }
    }
    cudaFree(src);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sender: %s\n", e.what());
    return 1;
  }
}

struct Transfer {
  double send_seconds = 0;  // the first send
  double warm_seconds = 0;  // the last one (cuda-ipc: the peer's memory already open)
  bool ok = false;
};

// Lands `bytes` on `land_device`, has a child write them from `send_device`, checks them.
Transfer transfer(const std::string& kind, size_t bytes, int land_device, int send_device, int seed) {
  boost::asio::io_context io;
  auto backend = make(kind, io, land_device);
  auto landing = backend->land(bytes, "127.0.0.1");
  EXPECT_EQ(backend->landed_bytes(), bytes);
  const std::string timing = cat("/tmp/tern-gpu-transfer-", getpid(), "-", seed);
  std::vector<std::string> args = {"/proc/self/exe", "--send", kind, std::to_string(send_device), landing->descriptor(),
                                   std::to_string(bytes), std::to_string(seed), timing};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  const auto limit = Clock::now() + std::chrono::seconds(120);  // a hung sender fails the test, never the run
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << kind << " sender still running after 120 s: killed";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Transfer t;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << kind << " sender failed";
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!landing->complete() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(landing->complete());
  if (!landing->complete()) return t;
  const TensorView landed = landing->bytes();
  EXPECT_EQ(landed.device(), Device::cuda);
  std::vector<std::byte> got(landed.nbytes());
  EXPECT_EQ(cudaMemcpy(got.data(), landed.data(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const auto want = pattern(bytes, seed);
  t.ok = got == want;
  EXPECT_TRUE(t.ok) << kind << ": the landed bytes differ from the sent ones";
  std::ifstream times(timing);
  times >> t.send_seconds;
  t.warm_seconds = t.send_seconds;
  for (double s; times >> s;) t.warm_seconds = s;
  std::remove(timing.c_str());
  landing.reset();
  EXPECT_EQ(backend->landed_bytes(), 0u);
  return t;
}

double device_copy_seconds(size_t bytes, int device) {
  cudaSetDevice(device);
  void *a = nullptr, *b = nullptr;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm
  cudaDeviceSynchronize();
  const auto t0 = Clock::now();
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  cudaFree(a);
  cudaFree(b);
  return s;
}

void report(const char* kind, size_t bytes, const Transfer& t, double local) {
  const double gbs = static_cast<double>(bytes) / t.send_seconds / 1e9, local_gbs = static_cast<double>(bytes) / local / 1e9;
  const double warm_gbs = static_cast<double>(bytes) / t.warm_seconds / 1e9;
  // The first send's time includes opening the peer's memory (cuda-ipc) or joining the communicator
  // (nccl); a warm one (cuda-ipc) is the copy alone.
  std::printf("[gpu transfer] %s: %zu MiB in %.3f ms = %.1f GB/s (fraction %.2f); warm %.3f ms = %.1f GB/s (fraction %.2f); "
              "device copy %.1f GB/s\n", kind, bytes >> 20, t.send_seconds * 1e3, gbs, gbs / local_gbs,
              t.warm_seconds * 1e3, warm_gbs, warm_gbs / local_gbs, local_gbs);
  ::testing::Test::RecordProperty(cat(kind, "_GBps"), std::to_string(gbs));
  ::testing::Test::RecordProperty(cat(kind, "_fraction_of_device_copy"), std::to_string(gbs / local_gbs));
  ::testing::Test::RecordProperty(cat(kind, "_warm_fraction_of_device_copy"), std::to_string(warm_gbs / local_gbs));
}

// The handle part of a cuda-ipc descriptor ("cuda-ipc://boot/pid/device/handle/bytes").
std::string handle_of(const std::string& descriptor) {
  std::vector<std::string> parts;
  std::istringstream in(descriptor.substr(std::string("cuda-ipc://").size()));
  for (std::string part; std::getline(in, part, '/');) parts.push_back(part);
  return parts.size() == 5 ? parts[3] : "malformed: " + descriptor;
}

TEST(GpuTransfer, CudaIpcBetweenTwoProcessesOnOneGpu) {
  if (gpus() < 1) GTEST_SKIP() << "no GPU";
  for (size_t bytes : {size_t{4096} + 17, size_t{3} << 20}) EXPECT_TRUE(transfer("cuda-ipc", bytes, 0, 0, 1).ok) << bytes;
  // A V4-Flash state of an 8K prompt is about 8192 x 3.5 KB + the rings: 64 MiB covers it; 1 GiB for bandwidth.
  for (size_t bytes : {size_t{64} << 20, size_t{1} << 30}) {
    const Transfer t = transfer("cuda-ipc", bytes, 0, 0, 2);
    ASSERT_TRUE(t.ok);
    report("cuda-ipc", bytes, t, device_copy_seconds(bytes, 0));
  }
}

// A landing whose transfer finished gives its buffer (and handle) to the next one; one dropped before its
// transfer finished never does (a late write could still land in it).
TEST(GpuTransfer, CudaIpcReusesFinishedLandingsOnly) {
  if (gpus() < 1) GTEST_SKIP() << "no GPU";
  boost::asio::io_context io;
  auto backend = make("cuda-ipc", io, 0);
  auto first = backend->land(1000, "127.0.0.1");
  const std::string used = handle_of(first->descriptor());
  EXPECT_EQ(first->bytes().nbytes(), 1000u);  // the transfer is over
  first.reset();
  auto second = backend->land(3000, "127.0.0.1");  // fits the same 2 MiB buffer
  EXPECT_EQ(handle_of(second->descriptor()), used);
  const std::string dropped = handle_of(second->descriptor());
  second.reset();  // never finished
  auto third = backend->land(1000, "127.0.0.1");
  EXPECT_NE(handle_of(third->descriptor()), dropped);
  EXPECT_EQ(backend->landed_bytes(), 1000u);
}

TEST(GpuTransfer, CudaIpcRefusesAnotherHostsDescriptorAndWrongSizes) {
  if (gpus() < 1) GTEST_SKIP() << "no GPU";
  boost::asio::io_context io;
  auto backend = make_cuda_ipc_backend(io, {0});
  auto landing = backend->land(1024, "127.0.0.1");
  std::string d = landing->descriptor();
  const auto data = pattern(1024, 3);
  auto send = [&](const std::string& descriptor, size_t n) {
    std::string result = "pending";
    // The previous call's guard, destroyed with no other work left, stopped the io_context: a stopped
    // context's run_one() returns at once without running the completion (this loop then spun forever).
    io.restart();
    auto work = boost::asio::make_work_guard(io);  // see send_main
    backend->send(descriptor, {Segment(data.data(), n)}, [&](std::string e) { result = std::move(e); });
    while (result == "pending") io.run_one();
    return result;
  };
  EXPECT_NE(send(d, 1000).find("the landing holds 1024"), std::string::npos);
  std::string other_host = d;
  other_host[11] = other_host[11] == '0' ? '1' : '0';  // another boot id
  EXPECT_NE(send(other_host, 1024).find("another host"), std::string::npos);
  EXPECT_NE(send("cuda-ipc://x", 1024).find("malformed"), std::string::npos);
  EXPECT_EQ(landing->bytes().nbytes(), 1024u);
}

TEST(GpuTransfer, NcclBetweenTwoGpus) {
#ifndef TERN_HAVE_NCCL
  GTEST_SKIP() << "built without nccl.h";
#else
  if (gpus() < 2) GTEST_SKIP() << "NCCL point-to-point needs two GPUs (one rank per GPU); found " << gpus();
  try {
    boost::asio::io_context io;
    make_nccl_backend(io, {0, std::chrono::milliseconds(1000)});
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  EXPECT_TRUE(transfer("nccl", size_t{5} << 20, 0, 1, 4).ok);
  const size_t bytes = size_t{1} << 30;
  const Transfer t = transfer("nccl", bytes, 0, 1, 5);
  ASSERT_TRUE(t.ok);
  report("nccl", bytes, t, device_copy_seconds(bytes, 0));
#endif
}

}  // namespace
}  // namespace tern::transfer

int main(int argc, char** argv) {
  if (argc == 8 && std::string(argv[1]) == "--send") return tern::transfer::send_main(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
