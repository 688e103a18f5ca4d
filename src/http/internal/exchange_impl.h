#pragma once

// The client connection and the Exchange behind it. Internal to src/http:
// include only from .cc files of src/http.

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "http/exchange.h"
#include "http/internal/io.h"
#include "http/internal/watchdog.h"
#include "http/internal/worker_impl.h"
#include "http/problem.h"
#include "http/server.h"
#include "http/tls.h"

namespace idemgate::http::internal {

// Beast's parser, except that the trailer fields of a chunked body are
// dropped, as RFC 9110 section 6.5.1 allows, instead of appended to the
// message's header fields once the body has been read.
// - A request's: for a buffered body, that is before the upstream request is
//   written: a trailer would then join the header section after the
//   identity, key and Host checks had looked at it, and could add a second
//   Host or an identity header.
// - An upstream response's: its head is written (and, for a stored response,
//   captured) before its body is read, so a trailer would not reach the
//   client or the store either way; dropping it keeps anything that reads
//   the field list later from seeing it as a header.
template <bool isRequest>
class ParserWithoutTrailers : public bhttp::parser<isRequest, bhttp::buffer_body> {
 private:
  void on_field_impl(bhttp::field name, beast::string_view name_string, beast::string_view value,
                     error_code& ec) override {
    ec = {};
    if (this->is_header_done()) return;  // a trailer field
    this->get().insert(name, name_string, value);
  }
};

// The request parser also counts a chunked body's limit itself (LimitBody),
// once per chunk. Beast (1.81) takes a chunk's size off its own limit before
// it has read the chunk-size line's extensions, and again each time it reads
// that line anew, which it does while a quoted extension value is still open
// when the bytes run out. A malformed line then failed as too large or as too
// long depending on how the bytes arrived.
class RequestParser final : public ParserWithoutTrailers<true> {
 public:
  // Limits a chunked body to `limit` bytes, counting the sizes of the chunks
  // whose lines were read whole, and the chunk extensions of all its chunk
  // lines together to `max_extension_bytes` (each line alone is bounded by
  // the header limit, see Feed; without a total, a body of tiny chunks with
  // long extensions could keep a connection busy for far more bytes than
  // the body limit allows). Called once the head is parsed. (Callers
  // compare a Content-Length with the limit themselves before reading.)
  void LimitBody(std::uint64_t limit, std::uint64_t max_extension_bytes) {
    if (chunked()) {
      body_limit(boost::none);
      chunk_room_ = limit;
      extension_room_ = max_extension_bytes;
    } else {
      body_limit(limit);
    }
  }

 private:
  void on_chunk_header_impl(std::uint64_t size, beast::string_view extensions, error_code& ec) override {
    if (size > chunk_room_) {
      ec = bhttp::error::body_limit;
      return;
    }
    if (extensions.size() > extension_room_) {
      ec = bhttp::error::bad_chunk_extension;
      return;
    }
    chunk_room_ -= size;
    extension_room_ -= extensions.size();
    ec = {};
  }

  std::uint64_t chunk_room_ = static_cast<std::uint64_t>(-1);
  std::uint64_t extension_room_ = static_cast<std::uint64_t>(-1);
};

class ResponseParser final : public ParserWithoutTrailers<false> {};

inline constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
// Upstream response header block limit.
inline constexpr std::uint32_t kUpstreamHeaderLimit = 64 * 1024;
// Bytes asked of the kernel per receive: header blocks, then bodies.
inline constexpr std::size_t kHeaderReadSize = 4096;
inline constexpr std::size_t kBodyReadSize = 64 * 1024;

// Deadline::CancelFn for a tcp::socket: cancels its pending operations.
void CancelSocket(void* socket);

// One client connection: its socket, read buffer and deadline, and the loop
// that reads requests and hands them to the handler.
class ClientConnection final : public SessionNode {
 public:
  // With `tls`, Run starts with the TLS handshake.
  ClientConnection(Worker& worker, tcp::socket socket, Handler& handler, std::shared_ptr<const TlsContext> tls);
  ~ClientConnection() override;

  // Serves requests until the connection closes.
  Task<void> Run();
  void OnDrain() override;

  // Writes a response the gateway made. Returns false when the write failed
  // (the connection is then marked to close).
  Task<bool> WriteResponse(Response response, int version, bool head_only, bool close);
  // Refuses the request whose head `parser` was reading (started at
  // `started`): reports it to the handler (Handler::Refused, with a new
  // request id) and, unless `code` is null (header_timeout), sends a problem
  // carrying that id and marks the connection to close.
  Task<void> Refuse(std::optional<ProblemCode> code, std::string_view detail, std::string_view reason,
                    int version, const RequestParser& parser, std::chrono::steady_clock::time_point started);
  // Half-closes, then reads and discards for a short while, so that a client
  // still sending does not get a reset that destroys our last response.
  Task<void> LingeringClose();

  Worker& worker;
  Worker::Impl& w;
  tcp::socket socket;
  std::shared_ptr<const TlsContext> tls_context;
  std::unique_ptr<TlsStream> tls;  // the session, once the handshake succeeded
  std::string tls_out;             // joined pieces of a TLS send
  std::string normalized_target;   // the request's path and query when they needed normalising
  beast::flat_buffer buffer;
  Deadline deadline;
  Handler& handler;
  std::string peer_ip;
  RequestHead head;        // reused per request
  std::string head_out;    // response head being written, reused
  // Exchange::SetRequestId of the current request (empty: none); kept
  // across requests so that setting it costs no allocation once warm.
  std::string request_id;
  bool idle = false;        // waiting for the first byte of a request
  bool must_close = false;  // close after the current response
  bool linger = false;      // unread request bytes may be in flight
};

enum class BodyState {
  kNone,      // the request has no body
  kUnread,    // not read yet
  kBuffered,  // read into body_ by ReadBody
  kStreamed,  // read (and forwarded) by Forward
  kFailed,    // reading failed part way: the connection must close
};

class ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(ClientConnection& connection, RequestParser& parser, const Limits& limits);

  const RequestHead& head() const override { return c_.head; }
  Worker& worker() override { return c_.worker; }
  bool SetBodyLimit(std::uint64_t limit) override;
  std::uint64_t body_limit() const override { return body_limit_; }
  Task<BodyStatus> ReadBody() override;
  std::string_view body() const override { return body_; }
  Task<void> Respond(Response response, bool close) override;
  Task<ForwardResult> Forward(UpstreamPool& pool, const ForwardRequest& request) override;  // proxy.cc
  void SetRequestId(std::string_view id) override { c_.request_id.assign(id); }
  bool stopping() const override { return c_.w.watchdog.killing(); }
  bool client_gone() const override;  // server.cc
  bool responded() const override { return responded_; }
  int status_sent() const override { return status_sent_; }

 private:
  struct PieceResult {
    std::size_t bytes = 0;
    BodyStatus status = BodyStatus::kOk;
  };
  // Reads request body bytes into [data, data + capacity): until it is full
  // or the body ends when `fill`, else whatever has arrived (at least one
  // byte, or the end). limits.idle_timeout bounds each wait for bytes, not
  // the whole piece; when it passes, the status is kClientGone and
  // body_timed_out_ is set (the caller answers 408 request-timeout).
  Task<PieceResult> ReadBodyPiece(char* data, std::size_t capacity, bool fill);
  // The detail of the 408 sent when the body stalled.
  std::string BodyTimeoutDetail() const;
  Task<bool> SendContinueIfNeeded();
  // Writes an interim (1xx) response head to the client, within
  // idle_timeout; false when the client did not take it.
  Task<bool> SendInterim(std::string_view head);
  // Whether an unread body is small enough to be read and dropped after the
  // answer, for the connection to be reused (a declared length within one
  // block, and no 100 Continue owed).
  bool CanDiscardBody() const;
  // Reads and drops that body; false when it did not arrive (the
  // connection is then closed).
  Task<bool> DiscardSmallBody();
  // Sends a problem with detail_ from inside Forward (nothing of a
  // response sent yet).
  Task<void> ForwardProblem(ForwardResult& result, ForwardOutcome outcome, ProblemCode code);
  void Fail(ForwardResult& result, ForwardOutcome outcome);

  ClientConnection& c_;
  RequestParser& parser_;
  Limits limits_;
  BodyState body_state_;
  std::uint64_t body_limit_;
  std::string body_;
  std::string detail_;  // of the problem Forward is about to send
  bool responded_ = false;
  bool continue_sent_ = false;
  bool forwarded_ = false;
  bool body_timed_out_ = false;  // a body read passed idle_timeout without a byte
  int status_sent_ = 0;
};

// The status of a failed body read.
BodyStatus BodyStatusFor(const error_code& ec, bool deadline_fired);

}  // namespace idemgate::http::internal
