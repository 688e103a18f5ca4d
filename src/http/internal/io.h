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

#include <algorithm>
#include <array>
#include <cassert>
#include <string_view>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/version.hpp>
#include <cstddef>
#include <cstring>
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

// Waits until `socket` takes more bytes or has some to read (or its end, or
// an error, to report), whichever comes first; `readable` tells which. For a
// send that must not miss an answer arriving while the peer reads no more.
// An expired deadline reads as timed_out.
Task<error_code> WaitWritableOrReadable(tcp::socket& socket, Deadline& deadline, bool& readable);

// Feeds the buffered bytes to `parser` and consumes what it took. Returns
// {} once the header (`header_only`) or the whole message is parsed,
// need_more when more bytes are needed, need_buffer when a buffer_body is
// full, or the parse error.
//
// `max_pending` bounds the bytes the parser may leave unconsumed while it
// waits for the end of a line: Beast limits the header block, but not a
// chunk-size line (with its extensions) or the trailer section, so a peer
// could otherwise grow the read buffer without end. Past the bound the
// parse fails with header_limit. The parser is also shown at most
// `max_pending` bytes at a time, so that such a line fails the same way when
// it arrives in one read as when it trickles in: whether a request is
// accepted must not depend on how the network cut it up.
template <bool isRequest>
error_code Feed(bhttp::basic_parser<isRequest>& parser, beast::flat_buffer& buffer, bool header_only,
                std::size_t max_pending = static_cast<std::size_t>(-1)) {
  error_code ec;
  for (;;) {
    if (header_only ? parser.is_header_done() : parser.is_done()) return {};
    if (buffer.size() == 0) return bhttp::error::need_more;
    const auto data = buffer.data();
    const std::size_t used = parser.put(asio::buffer(data.data(), std::min(data.size(), max_pending)), ec);
    buffer.consume(used);
    const bool waiting = ec == bhttp::error::need_more ||
                         (!ec && used == 0 && !(header_only ? parser.is_header_done() : parser.is_done()));
    if (waiting) return buffer.size() > max_pending ? bhttp::error::header_limit : bhttp::error::need_more;
    if (ec) return ec;
  }
}

// One receive without waiting, for a read that follows one which left its
// message incomplete: the kernel's queue-length hint (common/receive.h)
// counts a FIN but not a reset, so a reset that arrived right behind the
// bytes just read raises no further epoll edge, and a wait for the rest
// would last until its timeout. False when the receive would block (the
// caller then waits); otherwise `n` and `ec` are the receive's result. The
// socket must be in non-blocking mode.
inline bool ReceiveNow(tcp::socket& socket, asio::mutable_buffer into, error_code& ec, std::size_t& n) {
  n = socket.receive(into, 0, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    ec.clear();
    return false;
  }
  if (!ec && n == 0) ec = asio::error::eof;
  return true;
}

// State of one parse-and-receive loop. Reads go through async_read_some
// into a DrainAwareBuffer (not a direct receive plus async_wait, whose wait
// costs an epoll_ctl): the receive tells Asio when it emptied the socket, and
// the next read then waits for epoll instead of trying a receive that would
// fail (common/receive.h), so a request costs one recvmsg per side.
struct Pump {
  std::size_t bytes = 0;    // body bytes placed in the body buffer (ParseBody)
  std::size_t header_bytes = 0;  // bytes of the header block parsed so far (ParseHeader)
  error_code ec;            // a parse error, end_of_stream/partial_message, or a socket error
  bool need_more = false;   // receive more bytes, then parse again
  bool last_chunk_alone = false;  // ParseBody: Beast waits on a bare "0\r\n" (see there)
  bool version_not_supported = false;  // ParseHeader: a request line whose major version is not 1
  std::size_t empty_lines = 0;  // ParseHeader: empty lines skipped before the request line
};

// RFC 9112 section 2.2: a server SHOULD ignore at least one empty line
// received before the request line (some clients send a CRLF after a POST's
// body). ParseHeader skips this many before the first byte of a request line
// (CRLF or a bare LF each); one more is left to the parser, which refuses it
// (400 bad method).
inline constexpr std::size_t kMaxEmptyLinesBeforeRequest = 4;

// Consumes the empty lines at the front of `buffer` while nothing of the
// request line is parsed yet, up to kMaxEmptyLinesBeforeRequest for the
// message. Returns false when the buffer ends in a CR that may start one
// more (receive more bytes to tell).
inline bool SkipEmptyLinesBeforeRequest(beast::flat_buffer& buffer, Pump& out) {
  while (out.header_bytes == 0 && out.empty_lines < kMaxEmptyLinesBeforeRequest && buffer.size() > 0) {
    const auto data = buffer.data();
    const std::string_view bytes(static_cast<const char*>(data.data()), std::min<std::size_t>(data.size(), 2));
    if (bytes == "\r") return false;
    const std::size_t line = bytes.starts_with('\n') ? 1 : bytes == "\r\n" ? 2 : 0;
    if (line == 0) break;
    buffer.consume(line);
    ++out.empty_lines;
  }
  return true;
}

// Beast's parser takes only HTTP/1.0 and HTTP/1.1 (bad_version otherwise).
// RFC 9110 section 2.5 asks that a higher minor version of a major version
// the server speaks be read as the highest it speaks: after bad_version on a
// request line, one whose version is HTTP/1.2 to HTTP/1.9 is rewritten in
// place to HTTP/1.1 (kMended, parse again); one of another major version is
// kOtherMajor (answered 505); anything else kNone (a malformed line, 400).
// The line must be a request line's three parts (two spaces). Beast judges
// the version as soon as its eight bytes are in, before the line's end has
// arrived, so the line may stop after the version or its CR: a 1.x one is
// mended at once (what follows is judged on the mended line once it
// arrives), and another major waits for the line's end (kNeedMore), so that
// "HTTP/2.0x" is a 400 however its bytes arrive.
enum class VersionMend { kNone, kMended, kOtherMajor, kNeedMore };
inline VersionMend MendRequestVersion(beast::flat_buffer& buffer, std::size_t max_header) {
  const auto data = buffer.data();
  char* const p = static_cast<char*>(data.data());
  std::string_view line(p, std::min(data.size(), max_header));
  const std::size_t lf = line.find('\n');
  const bool whole = lf != std::string_view::npos;
  if (whole) line = line.substr(0, lf);
  if (line.ends_with('\r')) line.remove_suffix(1);
  if (std::count(line.begin(), line.end(), ' ') != 2) return VersionMend::kNone;
  constexpr std::string_view kPrefix = " HTTP/";
  if (line.size() < kPrefix.size() + 3) return VersionMend::kNone;
  const std::string_view tail = line.substr(line.size() - kPrefix.size() - 3);
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (!tail.starts_with(kPrefix) || !digit(tail[6]) || tail[7] != '.' || !digit(tail[8])) return VersionMend::kNone;
  if (tail[6] != '1') return whole ? VersionMend::kOtherMajor : VersionMend::kNeedMore;
  if (tail[8] < '2') return VersionMend::kNone;  // 1.0 and 1.1 failed for another reason
  p[line.size() - 1] = '1';
  return VersionMend::kMended;
}

// Parses the buffered bytes towards a complete header (start line and
// header fields) of at most `max_header` bytes; past it the parse fails with
// header_limit. Beast's header_limit alone does not bound that: it applies
// to the start line and to the fields separately, so a header block could
// reach twice the limit, and whether it got through depended on how the
// bytes arrived. Hence the parser is shown only what is left of the limit
// (the same Pump across the calls for one message). A request's empty lines
// before its request line are skipped (SkipEmptyLinesBeforeRequest) and not
// counted in the limit.
template <bool isRequest>
void ParseHeader(bhttp::basic_parser<isRequest>& parser, beast::flat_buffer& buffer, std::size_t max_header,
                 Pump& out) {
  out.need_more = false;
  for (;;) {
    if (parser.is_header_done()) return;
    if constexpr (isRequest) {
      if (!SkipEmptyLinesBeforeRequest(buffer, out)) {
        out.need_more = true;
        return;
      }
    }
    if (buffer.size() == 0) {
      out.need_more = true;
      return;
    }
    const auto data = buffer.data();
    error_code ec;
    const std::size_t used =
        parser.put(asio::buffer(data.data(), std::min(data.size(), max_header - out.header_bytes)), ec);
    buffer.consume(used);
    out.header_bytes += used;
    if (ec == bhttp::error::need_more || (!ec && used == 0 && !parser.is_header_done())) {
      // More bytes waiting than are left of the limit: the header cannot fit.
      if (buffer.size() > max_header - out.header_bytes) {
        out.ec = bhttp::error::header_limit;
      } else {
        out.need_more = true;
      }
      return;
    }
    if (ec) {
      if constexpr (isRequest) {
        if (ec == bhttp::error::bad_version && used == 0 && out.header_bytes == 0) {
          const VersionMend mend = MendRequestVersion(buffer, max_header);
          if (mend == VersionMend::kMended) continue;
          if (mend == VersionMend::kNeedMore) {
            out.need_more = true;
            return;
          }
          out.version_not_supported = mend == VersionMend::kOtherMajor;
        }
      }
      out.ec = ec;
      return;
    }
  }
}

// After ParseHeader failed with header_limit: true when it is the request
// target that does not fit (answered 414 rather than 431). That is so when
// nothing of the header was parsed yet (Beast consumes the request line only
// once it is whole), the bytes within the limit hold no line end, and they
// start with a method token and a space: the target runs past the limit.
inline bool RequestTargetPastHeaderLimit(const beast::flat_buffer& buffer, const Pump& pump,
                                         std::size_t max_header) {
  if (pump.header_bytes != 0) return false;
  const auto data = buffer.data();
  const std::string_view line(static_cast<const char*>(data.data()), std::min(data.size(), max_header));
  if (line.find('\n') != std::string_view::npos) return false;
  const std::size_t space = line.find(' ');
  if (space == 0 || space == std::string_view::npos || space + 1 == line.size() || line[space + 1] == ' ') {
    return false;
  }
  return std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(space), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
  });
}

// Parses buffered body bytes into the parser's buffer_body (whose data and
// size the caller set, `capacity` bytes). Done when the buffer is full, the
// message ends, or (unless `fill`) some bytes arrived. A chunk-size line or
// trailer section longer than `max_framing` bytes fails the parse.
template <bool isRequest, typename Body>
void ParseBody(bhttp::parser<isRequest, Body>& parser, beast::flat_buffer& buffer, std::size_t capacity, bool fill,
               std::size_t max_framing, Pump& out) {
  out.need_more = false;
#if BOOST_VERSION < 108600
  // Beast before 1.86 asserts (boostorg/beast#2861) when the last chunk of
  // a body without data chunks arrived as exactly "0\r\n" and is put again
  // with a fourth byte. Release builds pass the assert by, but a Debug build
  // (the ASan preset) would abort on a peer that sends it byte by byte. The
  // last chunk and its end are at least five bytes: wait for them.
  if (out.last_chunk_alone && buffer.size() < 5) {
    out.bytes = 0;
    out.need_more = true;
    return;
  }
#endif
  const error_code ec = Feed(parser, buffer, false, max_framing);
  out.bytes = capacity - parser.get().body().size;
  // Left unconsumed, these three bytes can only be a last chunk awaiting its
  // end: chunk data is always taken.
  out.last_chunk_alone = ec == bhttp::error::need_more && buffer.size() == 3 &&
                         std::memcmp(buffer.data().data(), "0\r\n", 3) == 0;
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
