// The host TCP backend: the decode side listens for data connections; a landing is host memory named by
// a random key; the prefill side connects, sends [magic "TPD1", 4 zero bytes, key u64, size u64, little
// endian] and the bytes, and gets one status byte back (0: landed; 1: unknown key, wrong size or
// cancelled). Works between any two hosts; used by the CPU tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transfer/backend.h"

namespace boost::asio {
class io_context;
}

namespace tern::transfer {

struct TcpBackendOptions {
  std::string bind_host = "127.0.0.1";  // decode side: where data connections are accepted
  uint16_t port = 0;                    // 0: any free port
  bool listen = false;                  // decode side listens; the prefill side only sends
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds stall_timeout{10000};  // decode side: a data connection silent this long is closed
};

std::unique_ptr<Backend> make_tcp_backend(boost::asio::io_context& io, const TcpBackendOptions& options);

}  // namespace tern::transfer
