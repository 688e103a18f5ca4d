#include "http/internal/tls_io.h"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <optional>

#include "http/internal/tls_impl.h"

namespace idemgate::http::internal {
namespace {

// `iov` as one buffer: its only piece, or the pieces joined into `joined`.
asio::const_buffer OneBuffer(const IoVec& iov, std::string& joined) {
  const auto pieces = iov.buffers();
  if (pieces.size() == 1) return pieces.front();
  joined.clear();
  for (const asio::const_buffer& b : pieces) joined.append(static_cast<const char*>(b.data()), b.size());
  return asio::buffer(joined);
}

// One TlsSendToUpstream, in its coroutine's frame, which outlives every
// operation started here: the record being written and, once one waits for
// room, the read beside it. asio::ssl::stream allows one read and one write
// at a time; both complete on the worker's thread. Once `watching`, the
// completions drive the records themselves and wake the coroutine when
// there is nothing left to wait for.
struct UpstreamSend {
  UpstreamConnection& conn;
  bool (*answer_in)(const beast::flat_buffer&);
  asio::const_buffer rest;  // what is left to send
  bool writing = false;
  bool reading = false;
  bool watching = false;
  bool answered = false;
  error_code write_ec;
  error_code read_ec;  // the read's failure (not its cancellation)
  asio::cancellation_signal stop_read;
  std::optional<asio::steady_timer> wake;  // while watching: cancelled to resume the coroutine

  void StartWrite() {
    writing = true;
    conn.tls->async_write_some(rest, [this](const error_code& ec, std::size_t n) { OnWritten(ec, n); });
  }

  void OnWritten(const error_code& ec, std::size_t n) {
    writing = false;
    rest += n;
    if (ec) write_ec = ec;
    if (!watching) return;
    if (!write_ec && rest.size() > 0 && !answered && !read_ec) {
      // The deadline cancelled the socket while this record's completion
      // was already queued: the next one would wait unbounded.
      if (!conn.deadline.fired()) {
        StartWrite();
        return;
      }
      write_ec = asio::error::operation_aborted;
    }
    // Sent, or failed: the read is no longer needed. A cancellation that
    // finds bytes already decrypted completes the read with them; bytes
    // only received stay in the session for the next read.
    if (reading) stop_read.emit(asio::cancellation_type::terminal);
    Wake();
  }

  void StartRead() {
    reading = true;
    conn.tls->async_read_some(
        conn.buffer.prepare(kHeaderReadSize),
        asio::bind_cancellation_slot(stop_read.slot(), [this](const error_code& ec, std::size_t n) { OnRead(ec, n); }));
  }

  void OnRead(const error_code& ec, std::size_t n) {
    reading = false;
    conn.buffer.commit(n);
    if (ec) {
      if (ec != asio::error::operation_aborted) read_ec = ec;
    } else if (answer_in(conn.buffer)) {
      answered = true;
    } else if (writing) {
      StartRead();  // interim responses: the upstream still reads
      return;
    }
    if (writing && (answered || read_ec)) {
      // The record is abandoned part-way: the session can still be read
      // (OpenSSL's read side does not depend on it), never written again.
      error_code ignored;
      conn.socket.cancel(ignored);
    }
    Wake();
  }

  void Wake() {
    if (wake) wake->cancel();
  }
};

}  // namespace

Task<error_code> TlsSendAll(TlsStream& tls, const IoVec& iov, std::string& joined) {
  error_code ec;
  co_await asio::async_write(tls, OneBuffer(iov, joined), asio::redirect_error(asio::use_awaitable, ec));
  co_return ec;
}

Task<error_code> TlsSendToUpstream(UpstreamConnection& conn, const IoVec& iov, std::string& joined,
                                   bool (*answer_in)(const beast::flat_buffer&), bool& answered, bool& probe_reads) {
  UpstreamSend s{.conn = conn, .answer_in = answer_in, .rest = OneBuffer(iov, joined)};
  // Record by record while each goes out at once: the completion of a
  // record the socket took whole is queued before this coroutine's turn
  // comes again (one thread, first in first out).
  while (s.rest.size() > 0) {
    if (conn.deadline.fired()) co_return asio::error::operation_aborted;
    s.StartWrite();
    co_await asio::post(asio::use_awaitable);
    if (s.writing) break;
    if (s.write_ec) co_return s.write_ec;
  }
  if (!s.writing) co_return error_code{};

  // The record waits for room: read beside it until everything is sent or
  // the upstream answered, went away or broke the session.
  s.watching = true;
  probe_reads = true;
  s.wake.emplace(conn.socket.get_executor(), asio::steady_timer::time_point::max());
  s.StartRead();
  while (s.writing || s.reading) {
    error_code ignored;
    co_await s.wake->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  }
  if (s.answered) {
    answered = true;
    co_return error_code{};
  }
  co_return s.read_ec ? s.read_ec : s.write_ec;
}

Task<std::size_t> TlsReadSome(TlsStream& tls, asio::mutable_buffer into, error_code& ec) {
  co_return co_await tls.async_read_some(into, asio::redirect_error(asio::use_awaitable, ec));
}

bool TlsReadNow(TlsStream& tls, asio::mutable_buffer into, error_code& ec, std::size_t& n) {
  // The session's own synchronous read: with a non-blocking socket its
  // receive fails with would_block instead of waiting, and what it received
  // stays in the session as with an asynchronous read.
  n = tls.read_some(into, ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) {
    ec.clear();
    return false;
  }
  return true;
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
