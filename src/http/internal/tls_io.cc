#include "http/internal/tls_io.h"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "http/internal/tls_impl.h"

namespace idemgate::http::internal {

Task<error_code> TlsSendAll(TlsStream& tls, const IoVec& iov, std::string& joined) {
  const auto pieces = iov.buffers();
  asio::const_buffer out;
  if (pieces.size() == 1) {
    out = pieces.front();
  } else {
    joined.clear();
    for (const asio::const_buffer& b : pieces) joined.append(static_cast<const char*>(b.data()), b.size());
    out = asio::buffer(joined);
  }
  error_code ec;
  co_await asio::async_write(tls, out, asio::redirect_error(asio::use_awaitable, ec));
  co_return ec;
}

Task<std::size_t> TlsReadSome(TlsStream& tls, asio::mutable_buffer into, error_code& ec) {
  co_return co_await tls.async_read_some(into, asio::redirect_error(asio::use_awaitable, ec));
}

std::unique_ptr<TlsStream> NewServerTlsStream(tcp::socket& socket, const TlsContext& context) {
  return std::make_unique<TlsStream>(socket, context.impl().context);
}

Task<error_code> TlsHandshake(TlsStream& tls, bool as_server) {
  error_code ec;
  co_await tls.async_handshake(as_server ? asio::ssl::stream_base::server : asio::ssl::stream_base::client,
                               asio::redirect_error(asio::use_awaitable, ec));
  co_return ec;
}

void TlsCloseNotify(TlsStream& tls) {
  // The socket is non-blocking: the alert goes out if it fits (it is a few
  // dozen bytes), and the wait for the peer's answer ends at once.
  error_code ignored;
  tls.shutdown(ignored);
}

}  // namespace idemgate::http::internal
