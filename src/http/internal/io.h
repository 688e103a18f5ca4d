#pragma once

// The socket I/O of the server and the proxy, without Beast's composed
// operations: sockets are non-blocking; sends are tried directly (no
// suspension, no allocation when the kernel takes everything, which is the
// common case) and only a full socket is awaited; receives are
// async_read_some into a DrainAwareBuffer (common/receive.h), so a read after a
// receive that emptied the socket waits for epoll instead of failing a
// recvfrom first. Beast is used as a sans-I/O parser (Feed);
// message heads are written by hand. Deadlines (watchdog.h) bound every wait.
// Internal to src/http: include only from .cc files of src/http.

#include <array>
#include <cassert>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "http/exchange.h"
#include "common/receive.h"
#include "http/internal/watchdog.h"

namespace boost::asio::ssl {
template <typename Stream>
class stream;
}  // namespace boost::asio::ssl

namespace idemgate::http::internal {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
// A TLS session over a connection's socket (asio::ssl; complete only where
// <boost/asio/ssl/stream.hpp> is included: tls_io.cc, upstream_impl.h).
using TlsStream = asio::ssl::stream<tcp::socket&>;

// A gather list for one send: at most kMax pieces.
class IoVec {
 public:
  static constexpr std::size_t kMax = 6;

  void Add(const void* data, std::size_t size) {
    assert(n_ < kMax);
    if (size > 0) v_[n_++] = asio::const_buffer(data, size);
  }
  void Add(std::string_view s) { Add(s.data(), s.size()); }
  bool empty() const { return first_ == n_; }
  // Drops `n` bytes from the front (sent).
  void Consume(std::size_t n);
  std::span<const asio::const_buffer> buffers() const {
    return std::span<const asio::const_buffer>(v_.data() + first_, n_ - first_);
  }

 private:
  std::array<asio::const_buffer, kMax> v_{};
  std::size_t first_ = 0;
  std::size_t n_ = 0;
};

// Sends as much of `iov` as the socket takes now and consumes it. Returns
// true when everything was sent or a hard error happened (in `ec`); false
// when the socket is full (wait for writability, then call again).
bool TrySend(tcp::socket& socket, IoVec& iov, error_code& ec);

// Sends all of `iov`: TrySend, then waits for writability while `deadline`
// allows. An expired deadline reads as asio::error::timed_out.
Task<error_code> SendAll(tcp::socket& socket, Deadline& deadline, IoVec& iov);

// Waits until `socket` is readable; an expired deadline reads as timed_out.
Task<error_code> WaitReadable(tcp::socket& socket, Deadline& deadline);

// Feeds the buffered bytes to `parser` and consumes what it took. Returns
// {} once the header (`header_only`) or the whole message is parsed,
// need_more when more bytes are needed, need_buffer when a buffer_body is
// full, or the parse error.
//
// `max_pending` bounds the bytes the parser may leave unconsumed while it
// waits for the end of a line: Beast limits the header block, but not a
// chunk-size line (with its extensions) or the trailer section, so a peer
// could otherwise grow the read buffer without end. Past the bound the
// parse fails with header_limit.
template <bool isRequest>
error_code Feed(bhttp::basic_parser<isRequest>& parser, beast::flat_buffer& buffer, bool header_only,
                std::size_t max_pending = static_cast<std::size_t>(-1)) {
  error_code ec;
  for (;;) {
    if (header_only ? parser.is_header_done() : parser.is_done()) return {};
    if (buffer.size() == 0) return bhttp::error::need_more;
    const std::size_t used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    const bool waiting = ec == bhttp::error::need_more ||
                         (!ec && used == 0 && !(header_only ? parser.is_header_done() : parser.is_done()));
    if (waiting) return buffer.size() > max_pending ? bhttp::error::header_limit : bhttp::error::need_more;
    if (ec) return ec;
  }
}

// State of one parse-and-receive loop. Reads go through async_read_some
// into a DrainAwareBuffer (not a direct receive plus async_wait, whose wait
// costs an epoll_ctl): the receive tells Asio when it emptied the socket, and
// the next read then waits for epoll instead of trying a receive that would
// fail (common/receive.h), so a request costs one recvmsg per side.
struct Pump {
  std::size_t bytes = 0;    // body bytes placed in the body buffer (ParseBody)
  error_code ec;            // a parse error, end_of_stream/partial_message, or a socket error
  bool need_more = false;   // receive more bytes, then parse again
};

// Parses the buffered bytes towards a complete header.
template <bool isRequest>
void ParseHeader(bhttp::basic_parser<isRequest>& parser, beast::flat_buffer& buffer, Pump& out) {
  out.need_more = false;
  const error_code ec = Feed(parser, buffer, true);
  if (ec == bhttp::error::need_more) {
    out.need_more = true;
  } else {
    out.ec = ec;
  }
}

// Parses buffered body bytes into the parser's buffer_body (whose data and
// size the caller set, `capacity` bytes). Done when the buffer is full, the
// message ends, or (unless `fill`) some bytes arrived. A chunk-size line or
// trailer section longer than `max_framing` bytes fails the parse.
template <bool isRequest, typename Body>
void ParseBody(bhttp::parser<isRequest, Body>& parser, beast::flat_buffer& buffer, std::size_t capacity, bool fill,
               std::size_t max_framing, Pump& out) {
  out.need_more = false;
  const error_code ec = Feed(parser, buffer, false, max_framing);
  out.bytes = capacity - parser.get().body().size;
  if (!ec || ec == bhttp::error::need_buffer) return;
  if (ec != bhttp::error::need_more) {
    out.ec = ec;
    return;
  }
  out.need_more = fill || out.bytes == 0;
}

// Applies the result of one receive of `n` bytes: commits them, or on end
// of stream completes a body delimited by the connection's end
// (end_of_stream before any byte of a message, partial_message inside one).
// Returns true when the caller should parse again.
template <bool isRequest>
bool OnReceive(bhttp::basic_parser<isRequest>& parser, beast::flat_buffer& buffer, const error_code& ec,
               std::size_t n, Pump& out) {
  buffer.commit(n);
  if (!ec) return true;
  if (ec == asio::error::eof) {
    if (parser.is_header_done() && parser.need_eof()) {
      error_code eof_ec;
      parser.put_eof(eof_ec);
      out.ec = eof_ec;
      return !eof_ec;
    }
    out.ec = parser.got_some() || buffer.size() > 0 ? bhttp::error::partial_message : bhttp::error::end_of_stream;
    return false;
  }
  out.ec = ec;
  return false;
}

// Appends "Name: value\r\n" for one field.
inline void AppendField(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ", 2);
  out.append(value);
  out.append("\r\n", 2);
}

// Appends "HTTP/1.x 200 OK\r\n".
void AppendStatusLine(std::string& out, int version, unsigned status, std::string_view reason);

// The chunk-size line of a chunk of `size` bytes ("1f4\r\n"), in `buf`.
std::string_view ChunkHeader(std::size_t size, char (&buf)[24]);
inline constexpr std::string_view kCrlf = "\r\n";
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace idemgate::http::internal
