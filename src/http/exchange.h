#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/record.h"
#include "http/message.h"

// One request/response exchange on a client connection, as the request
// handler sees it (no Beast types). The server makes one Exchange per
// request and keeps it alive until the handler's coroutine returns.
namespace idemgate::http {

template <typename T>
using Task = boost::asio::awaitable<T>;

class Worker;
class UpstreamPool;

// What a ForwardObserver receives once the upstream response was read to the
// end: the response as the client sees it (status, every header line in
// order incl. repeated Set-Cookie and the Content-Length the gateway wrote,
// body up to the capture cap, else body_omitted with an empty body; without
// Transfer-Encoding, Connection and the X-Request-Id of
// Exchange::SetRequestId, which belongs to the request, not the response)
// and the lines removed by ForwardRequest::strip_response_headers.
struct CapturedResponse {
  core::StoredResponse response;
  std::vector<Header> stripped;
  // With response.body_omitted: the response was cut short by the upstream
  // timeout (the upstream may still be running the request).
  bool timed_out = false;
};

enum class ForwardOutcome {
  kCompleted,        // the upstream response was relayed in full
  kClientGone,       // the client left (or stopped reading); with an observer the
                     // upstream response was still read to the end and captured
  kConnectFailed,    // no upstream connection: 502 upstream-unavailable sent
  kTimedOut,         // the upstream timeout passed: 504 upstream-timeout sent, or
                     // the client connection closed when the response had started
  kUpstreamFailed,   // the upstream broke the exchange or sent malformed HTTP: 502
                     // sent, or the client connection closed when the response had started
  kRequestTooLarge,  // the streamed request body passed the limit: 413 sent
  kBadRequest,       // the request body was malformed (bad chunking): 400 sent
  kShutdown,         // the server stopped the exchange after shutdown_grace
  kNotForwarded,     // refused before forwarding (e.g. admission): reported to an
                     // observer by the refuser; `status` is what the client got
};

// "completed", "client_gone", "connect_failed", "timed_out", "upstream_failed",
// "request_too_large", "bad_request", "shutdown", "not_forwarded".
std::string_view ForwardOutcomeName(ForwardOutcome outcome);

struct ForwardResult {
  ForwardOutcome outcome = ForwardOutcome::kCompleted;
  int status = 0;           // the status the client was sent (0: none)
  int upstream_status = 0;  // the upstream's final status (0: none was read)
  bool response_started = false;  // response bytes reached the client socket
  bool captured = false;    // ForwardObserver::OnResponse was called
  // From the connect (or taking an idle connection; the wait for a free one
  // not counted) until the upstream was done with.
  std::chrono::microseconds upstream_duration{0};
  // An upstream connection was obtained and the request went out on it (or
  // began to): the upstream was contacted, whatever followed (a response,
  // a timeout, a broken connection). upstream_duration is meaningful then.
  bool upstream_contacted = false;
  std::uint64_t request_body_bytes = 0;
  std::uint64_t response_body_bytes = 0;
  bool retried = false;     // a stale pooled connection failed and the request was re-sent once
};

// Receives the outcome of one forwarded request (the hook for the
// idempotency engine). Methods run on the exchange's executor.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // The upstream answered with a final status: the response was read to the
  // end, or (with `captured.response.body_omitted`, and no header fields for
  // a refused head) it broke off, timed out or was refused after its status
  // line, since the upstream ran the request all the same. Called before the
  // last bytes of the response are written to the client, so that a client
  // that retries as soon as it has the response finds the outcome recorded.
  // The response keeps streaming to the client after this returns; for a
  // small response nothing has been written yet. Not called when no final
  // status line came (no connection, a failure or timeout before it).
  virtual Task<void> OnResponse(CapturedResponse& captured) = 0;
  // No upstream response will be relayed: Forward is about to send its own
  // error (502, 504, 413, 400, or 503 at shutdown); `result.outcome` says
  // why. Called before that error is written, so that a client that retries
  // as soon as it has it finds the outcome recorded. OnFinished still follows.
  virtual Task<void> OnNoResponse(const ForwardResult& /*result*/) { co_return; }
  // Called exactly once, last, whatever happened (also when the request was
  // refused before forwarding, with outcome and status set by the refuser).
  virtual Task<void> OnFinished(const ForwardResult& result) = 0;
};

// How to forward one request. Header names are matched case-insensitively.
struct ForwardRequest {
  // Added to the upstream request; client lines with the same names are dropped.
  std::vector<Header> set_headers;
  // Client request lines dropped before forwarding. The names must outlive
  // the Forward call.
  std::vector<std::string_view> remove_headers;
  // Upstream response lines dropped before the client sees them; reported in
  // CapturedResponse::stripped.
  // The names must outlive the Forward call.
  std::span<const std::string_view> strip_response_headers;
  // Added to the response the client sees (after stripping).
  std::vector<Header> add_response_headers;
  // When non-empty, sent upstream instead of the client's path and query
  // (after the upstream's base path); origin-form, starting with '/'.
  std::string target;
  // X-Request-Id sent upstream (replacing the client's lines); empty: the
  // client's lines pass unchanged.
  std::string_view request_id;
  // When set, the response is captured for it (see ForwardObserver) and, if
  // the client goes away, the upstream response is still read to the end.
  // OnFinished is NOT called by Forward: the caller owns that call, so it can
  // also report refusals that never reached Forward.
  ForwardObserver* observer = nullptr;
  // Capture at most this many body bytes; beyond it body_omitted is set.
  std::uint64_t capture_max_body_bytes = 1024 * 1024;
  // When set, called once with `on_complete_arg` as soon as the upstream's
  // response has been read whole (after the observer's OnResponse) and
  // before its last bytes are written to the client; not called when the
  // response does not complete. The caller frees there what it holds for
  // the request (its admission slot), so that a client sending its next
  // request the moment it has this response finds it freed.
  void (*on_complete)(void* arg) = nullptr;
  void* on_complete_arg = nullptr;
  // Once the response's status line is in, the relay of its body ends by
  // then at the latest, until the upstream's response is whole: the wait
  // for each piece of the body is cut there, as by the upstream timeout,
  // and so is a wait for the client (the client is then cut, and the rest of
  // the upstream's response still read for the observer). The idempotency
  // step sets it inside the key's lease, so that a response relayed slowly
  // to a slow client cannot outlive the reservation and let a retry take
  // the key over while the original is still running (cut after its status
  // line, the outcome is stored). The wait for the status line is bounded by
  // the upstream timeout alone: cutting it would not stop the upstream.
  // Instead the request is sent only while the whole upstream timeout still
  // fits before finish_by: the wait for a free pooled connection and the
  // connect end at finish_by - timeout at the latest, and past it Forward
  // answers 502 upstream-unavailable (kConnectFailed) without sending it.
  // Default: only the upstream timeout and the idle timeout bound the body.
  std::chrono::steady_clock::time_point finish_by = std::chrono::steady_clock::time_point::max();
  // How far the relay may read the upstream's response ahead of a client
  // that reads slower than the upstream sends (the bytes wait in memory),
  // so that the upstream connection is free and, with an observer, the
  // response recorded at the upstream's pace. With an observer the
  // capture limit counts too (the larger applies): a response that fits it
  // is recorded whole however slow the client. Plain-text clients only.
  std::uint64_t read_ahead_bytes = 256 * 1024;
};

// Why reading the request body stopped.
enum class BodyStatus {
  kOk,          // the whole body is in body()
  kTooLarge,    // it passed the body limit (nothing sent yet: answer 413)
  kMalformed,   // bad chunked coding (answer 400)
  kClientGone,  // the client closed or reset, or stalled past the idle timeout (then ReadBody has answered 408 itself)
};

class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual const RequestHead& head() const = 0;
  // The worker (I/O thread) this exchange runs on; every await resumes there.
  virtual Worker& worker() = 0;

  // The body limit for this request (default: the server's max_request_bytes).
  // Returns false when the declared Content-Length already exceeds it.
  // Only before the body is read or forwarded.
  virtual bool SetBodyLimit(std::uint64_t limit) = 0;
  virtual std::uint64_t body_limit() const = 0;

  // Reads the whole request body into memory (at most body_limit() bytes).
  // Sends "100 Continue" first when the client asked for it. After kOk the
  // body is body() and Forward sends it with Content-Length.
  virtual Task<BodyStatus> ReadBody() = 0;
  // The buffered body; empty until ReadBody returned kOk. Valid until the
  // exchange ends.
  virtual std::string_view body() const = 0;

  // Sends a response made by the gateway. Adds Date when absent, frames the
  // body, and closes the connection afterwards when the request body was not
  // read, the client asked for it, or the server is draining.
  // `close` forces Connection: close. At most one response per exchange.
  virtual Task<void> Respond(Response response, bool close = false) = 0;

  // Forwards the request to `pool`'s upstream and relays the response
  // (SPEC §2 steps 7-8): hop-by-hop fields removed both ways, forwarding
  // headers set, bodies streamed through a bounded buffer (or the buffered
  // body after ReadBody). Sends its own problem (502/504/413/400) when no
  // upstream response could be relayed, and 503 shutting-down, without
  // sending the request, once stopping(). `pool` must belong to worker() and
  // outlive the call. At most once per exchange, and not after Respond.
  virtual Task<ForwardResult> Forward(UpstreamPool& pool, const ForwardRequest& request) = 0;

  // Every response of this exchange from now on (made by the gateway, a
  // problem Forward or the server sends, or relayed from the upstream)
  // carries exactly one `X-Request-Id: id`, replacing the lines it had, so
  // that a client can quote the id the request was logged under. `id` is
  // copied (into a buffer the connection keeps across its requests).
  virtual void SetRequestId(std::string_view id) = 0;

  // True once the server stopped waiting for its in-flight requests (past
  // shutdown_grace) and cuts every exchange: nothing new may start then;
  // Forward answers 503 shutting-down without contacting the upstream.
  virtual bool stopping() const = 0;

  // True when the client has closed or reset its connection: its FIN (also
  // behind unread bytes, such as a pipelined request or a TLS close_notify;
  // a client that only half-closed counts too) or an error is on the socket.
  // Bytes alone mean it is still there. One system call, without waiting:
  // for rare checks (a waiter about to take a key), not per request.
  virtual bool client_gone() const { return false; }

  // True once a response (or its first bytes) was sent.
  virtual bool responded() const = 0;
  // The status sent (0: none yet).
  virtual int status_sent() const = 0;
};

}  // namespace idemgate::http
