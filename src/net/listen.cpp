#include "net/listen.h"

#include "core/error.h"

namespace tern::net {

uint16_t listen_on(boost::asio::ip::tcp::acceptor& a, const std::string& host, uint16_t port, const ListenNames& names) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  TERN_CHECK(!ec, names.host_flag, " ", host, " is not an IP address");
  const asio::ip::tcp::endpoint endpoint(address, port);
  a.open(endpoint.protocol(), ec);
  TERN_CHECK(!ec, "cannot open a socket: ", ec.message());
  a.set_option(asio::socket_base::reuse_address(true), ec);
  a.bind(endpoint, ec);
  TERN_CHECK(!ec, "cannot bind ", names.port_name, host, ":", port, ": ", ec.message(),
             ec == asio::error::address_in_use ? cat(" (the port is in use: ", names.in_use, ")") : std::string());
  a.listen(asio::socket_base::max_listen_connections, ec);
  TERN_CHECK(!ec, "cannot listen on ", host, ":", port, ": ", ec.message());
  return a.local_endpoint().port();
}

}  // namespace tern::net
