#include "http/internal/io.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/status.hpp>
#include <charconv>

namespace idemgate::http::internal {

void IoVec::Consume(std::size_t n) {
  while (n > 0 && first_ < n_) {
    asio::const_buffer& b = v_[first_];
    if (n >= b.size()) {
      n -= b.size();
      ++first_;
    } else {
      b += n;
      n = 0;
    }
  }
}

bool TrySend(tcp::socket& socket, IoVec& iov, error_code& ec) {
  while (!iov.empty()) {
    const std::size_t n = socket.write_some(iov.buffers(), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      ec = {};
      return false;
    }
    if (ec) return true;
    iov.Consume(n);
  }
  return true;
}

Task<error_code> SendAll(tcp::socket& socket, Deadline& deadline, IoVec& iov) {
  error_code ec;
  while (!TrySend(socket, iov, ec)) {
    if (deadline.fired()) co_return asio::error::timed_out;
    auto [wait_ec] = co_await socket.async_wait(tcp::socket::wait_write, asio::as_tuple(asio::use_awaitable));
    if (deadline.fired()) co_return asio::error::timed_out;
    if (wait_ec) co_return wait_ec;
  }
  co_return ec;
}

Task<error_code> WaitReadable(tcp::socket& socket, Deadline& deadline) {
  if (deadline.fired()) co_return asio::error::timed_out;
  auto [ec] = co_await socket.async_wait(tcp::socket::wait_read, asio::as_tuple(asio::use_awaitable));
  if (deadline.fired()) co_return asio::error::timed_out;
  co_return ec;
}

Task<error_code> WaitWritableOrReadable(tcp::socket& socket, Deadline& deadline, bool& readable) {
  using namespace asio::experimental::awaitable_operators;
  if (deadline.fired()) co_return asio::error::timed_out;
  // Each wait re-arms the socket's epoll registration (EPOLL_CTL_MOD), so a
  // byte that arrived before the wait began still ends it. The wait that
  // loses is cancelled.
  const auto which = co_await (socket.async_wait(tcp::socket::wait_write, asio::as_tuple(asio::use_awaitable)) ||
                               socket.async_wait(tcp::socket::wait_read, asio::as_tuple(asio::use_awaitable)));
  if (deadline.fired()) co_return asio::error::timed_out;
  readable = which.index() == 1;
  co_return readable ? std::get<0>(std::get<1>(which)) : std::get<0>(std::get<0>(which));
}

void AppendStatusLine(std::string& out, int version, unsigned status, std::string_view reason) {
  out.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  char digits[8];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), status);
  (void)ec;
  out.append(digits, end);
  out += ' ';
  if (reason.empty()) {
    // Beast names the codes it knows and says "<unknown-status>" for the
    // rest (418, 299): those go out with the empty reason HTTP allows.
    const auto r = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
    if (!r.starts_with('<')) reason = std::string_view(r.data(), r.size());
  }
  out.append(reason);
  out.append("\r\n", 2);
}

std::string_view ChunkHeader(std::size_t size, char (&buf)[24]) {
  auto [end, ec] = std::to_chars(buf, buf + 20, size, 16);
  (void)ec;
  *end++ = '\r';
  *end++ = '\n';
  return std::string_view(buf, static_cast<std::size_t>(end - buf));
}

}  // namespace idemgate::http::internal
