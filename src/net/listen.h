// Opening a listening TCP socket with errors a user can act on: the HTTP server's port (http.cpp) and the
// prefill-decode transfer port (transfer/channel.cpp). For the .cpp files that already use Asio.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>

namespace tern::net {

struct ListenNames {
  const char* host_flag;  // the option that gave the host: "--host X is not an IP address"
  const char* port_name;  // "cannot bind <port_name>host:port"
  const char* in_use;     // the advice when the port is taken
};

// Opens, binds (address reuse on) and listens on host (an IP address):port; throws tern::Error naming
// the step that failed. Returns the port bound (port 0: any free port).
uint16_t listen_on(boost::asio::ip::tcp::acceptor& acceptor, const std::string& host, uint16_t port,
                   const ListenNames& names);

}  // namespace tern::net
