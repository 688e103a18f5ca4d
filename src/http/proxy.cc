// Exchange::Forward: the reverse proxy (SPEC §2 steps 7-8). The request is
// relayed through one bounded block: head plus the first block of body in
// one send, then block by block; the response likewise, captured on the way
// when an observer asks for it. Heads are written by hand from the parsed
// fields; sockets are driven directly (internal/io.h).
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/http/error.hpp>
#include <charconv>
#include <cstring>
#include <utility>

#include "common/ascii.h"
#include "http/headers.h"
#include "http/internal/exchange_impl.h"
#include "http/internal/io.h"
#include "http/internal/tls_io.h"
#include "http/internal/upstream_impl.h"

namespace idemgate::http {

std::string_view ForwardOutcomeName(ForwardOutcome outcome) {
  switch (outcome) {
    case ForwardOutcome::kCompleted: return "completed";
    case ForwardOutcome::kClientGone: return "client_gone";
    case ForwardOutcome::kConnectFailed: return "connect_failed";
    case ForwardOutcome::kTimedOut: return "timed_out";
    case ForwardOutcome::kUpstreamFailed: return "upstream_failed";
    case ForwardOutcome::kRequestTooLarge: return "request_too_large";
    case ForwardOutcome::kBadRequest: return "bad_request";
    case ForwardOutcome::kShutdown: return "shutdown";
    case ForwardOutcome::kNotForwarded: return "not_forwarded";
  }
  return "unknown";
}

namespace internal {
namespace {

using RequestMessage = bhttp::request<bhttp::buffer_body>;
using ResponseMessage = bhttp::response<bhttp::buffer_body>;

std::string_view View(beast::string_view s) { return std::string_view(s.data(), s.size()); }

template <typename Names>
bool InList(const Names& names, std::string_view name) {
  for (const auto& n : names) {
    if (NameEquals(n, name)) return true;
  }
  return false;
}

bool InHeaders(const std::vector<Header>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (NameEquals(h.name, name)) return true;
  }
  return false;
}

void AppendNumberField(std::string& out, std::string_view name, std::uint64_t value) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), value);
  (void)ec;
  AppendField(out, name, std::string_view(digits, static_cast<std::size_t>(end - digits)));
}

// The request fields the gateway passes or creates itself (SPEC section 2
// step 7): when it passes the client's, a Connection header naming them does
// not remove them, as it does not remove the client's X-Forwarded-For; the
// X-Request-Id passed is the one the gateway logs.
bool GatewayOwned(std::string_view name) {
  return NameEquals(name, "x-request-id") || NameEquals(name, "traceparent");
}

// How the upstream request body is framed.
enum class Framing { kNone, kLength, kChunked };

// Writes the upstream request head from the parsed client request, which
// stays untouched (RequestHead views into it remain valid for the whole
// exchange): hop-by-hop fields and those Connection names dropped, the
// client's forwarding fields (IsClientForwardingField) replaced by the
// gateway's own, the ForwardRequest's changes applied, the body re-framed. `in` holds the header section only: the request parser drops
// a chunked body's trailer fields (RequestParser).
Framing WriteUpstreamRequestHead(const RequestMessage& in, const RequestHead& head, const ForwardRequest& fr,
                                 const UpstreamTarget& target, std::optional<std::size_t> buffered_size,
                                 std::string& out) {
  HopByHopFilter filter;
  std::vector<std::string_view> xff;
  std::string_view forwarded_host;
  std::size_t traceparents = 0;
  std::string_view traceparent;
  for (const auto& f : in) {
    switch (f.name()) {
      case bhttp::field::connection: filter.AddConnectionValue(View(f.value())); break;
      case bhttp::field::host: forwarded_host = View(f.value()); break;
      default: {
        const std::string_view name = View(f.name_string());
        if (NameEquals(name, "x-forwarded-for")) {
          xff.push_back(View(f.value()));
        } else if (NameEquals(name, "traceparent")) {
          ++traceparents;
          traceparent = View(f.value());
        }
      }
    }
  }
  // An absolute-form target names the host, and the Host lines are ignored
  // (RFC 9112 section 3.2.2).
  if (!head.authority.empty()) forwarded_host = head.authority;
  const bool new_trace = !(traceparents == 1 && IsValidTraceparent(traceparent));
  const bool replace_request_id = !fr.request_id.empty();
  Framing framing = Framing::kNone;
  if (buffered_size) {
    if (*buffered_size > 0 || head.has_body()) framing = Framing::kLength;
  } else if (head.chunked) {
    framing = Framing::kChunked;
  } else if (head.content_length) {
    framing = Framing::kLength;
  }

  out.clear();
  out.append(head.method);
  out += ' ';
  out.append(target.base_path);
  out.append(fr.target.empty() ? head.path_and_query : std::string_view(fr.target));
  out.append(std::string_view(" HTTP/1.1\r\n"));
  // The upstream gets exactly one Host (the server refused requests with
  // more than one): the client's, the absolute-form target's authority, or
  // the upstream's own when the client sent none or an empty one (RFC 9112
  // section 3.2: a target without an authority), or named Host in
  // Connection.
  const bool own_host = forwarded_host.empty() || filter.ShouldDrop("host");
  for (const auto& f : in) {
    const bhttp::field id = f.name();
    const std::string_view name = View(f.name_string());
    if (id == bhttp::field::connection || id == bhttp::field::expect || id == bhttp::field::content_length ||
        (filter.ShouldDrop(name) && !GatewayOwned(name)) ||
        (id == bhttp::field::host && (own_host || !head.authority.empty()))) {
      continue;
    }
    if (IsClientForwardingField(name)) continue;
    if (replace_request_id && NameEquals(name, "x-request-id")) continue;
    if (new_trace && (NameEquals(name, "traceparent") || NameEquals(name, "tracestate"))) continue;
    if (!fr.remove_headers.empty() && InList(fr.remove_headers, name)) continue;
    if (!fr.set_headers.empty() && InHeaders(fr.set_headers, name)) continue;
    AppendField(out, name, View(f.value()));
  }
  if (own_host) {
    if (target.port == target.default_port()) {
      AppendField(out, "Host", target.host);
    } else {
      out.append(std::string_view("Host: "));
      out.append(target.host);
      out += ':';
      char digits[8];
      auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), target.port);
      (void)ec;
      out.append(digits, end);
      out.append(kCrlf);
    }
  } else if (!head.authority.empty()) {
    AppendField(out, "Host", head.authority);
  }
  out.append(std::string_view("X-Forwarded-For: "));
  for (std::string_view v : xff) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    if (v.empty()) continue;
    out.append(v);
    out.append(std::string_view(", "));
  }
  out.append(head.peer_ip);
  out.append(kCrlf);
  AppendField(out, "X-Forwarded-Proto", head.secure ? std::string_view("https") : std::string_view("http"));
  if (!forwarded_host.empty()) AppendField(out, "X-Forwarded-Host", forwarded_host);
  if (replace_request_id) AppendField(out, "X-Request-Id", fr.request_id);
  if (new_trace) {
    out.append(std::string_view("traceparent: 00-"));
    AppendRandomHex(32, out);
    out += '-';
    AppendRandomHex(16, out);
    out.append(std::string_view("-00\r\n"));
  }
  for (const Header& h : fr.set_headers) AppendField(out, h.name, h.value);
  if (!target.keepalive) AppendField(out, "Connection", "close");
  if (framing == Framing::kLength) {
    AppendNumberField(out, "Content-Length", buffered_size ? *buffered_size : *head.content_length);
  } else if (framing == Framing::kChunked) {
    AppendField(out, "Transfer-Encoding", "chunked");
  }
  out.append(kCrlf);
  return framing;
}

// Calls `pass(name, value)` for each field of an upstream response head
// (final or interim) that goes on to the client as the upstream wrote it:
// not the hop-by-hop fields nor those its Connection names, not
// Content-Length (the gateway frames what it relays), not the gateway's own
// fields (strip_response_headers, handed to `stripped(name, value)`), and
// not the upstream's X-Request-Id when the request has an id of its own.
template <class Pass, class Stripped>
void ForEachRelayedField(const ResponseMessage& res, const ForwardRequest& fr, std::string_view request_id,
                         Pass&& pass, Stripped&& stripped) {
  HopByHopFilter filter;
  for (const auto& f : res) {
    if (f.name() == bhttp::field::connection) filter.AddConnectionValue(View(f.value()));
  }
  for (const auto& f : res) {
    const std::string_view name = View(f.name_string());
    if (f.name() == bhttp::field::connection || filter.ShouldDrop(name)) continue;
    if (f.name() == bhttp::field::content_length) continue;
    if (!fr.strip_response_headers.empty() && InList(fr.strip_response_headers, name)) {
      stripped(name, View(f.value()));
      continue;
    }
    if (!request_id.empty() && NameEquals(name, "x-request-id")) continue;
    pass(name, View(f.value()), f.name());
  }
}

// Writes the head the client gets from the upstream response: hop-by-hop
// fields and those the upstream's Connection names dropped,
// strip_response_headers removed (into `captured->stripped`),
// add_response_headers added, framing and Connection of our own. With
// `capture`, the fields the client sees are copied into `captured` in the
// same order, Content-Length included (not Transfer-Encoding, Connection or
// X-Request-Id).
//
// The upstream's Content-Length lines are never copied: the parser accepted
// forms a client may refuse or read differently ("5, 5", two "5" lines,
// "0005"). Unless the body is re-chunked, one canonical Content-Length with
// the parsed `content_length` is written instead, and none on a 204, which
// must not carry one (RFC 9110 section 8.6). A HEAD or 304 response keeps
// it: there it gives the length a GET would have had.
//
// `request_id` (unless empty) replaces the upstream's X-Request-Id lines; it
// is not captured: a replay carries the id of the request it answers.
void WriteClientResponseHead(const ResponseMessage& res, const ForwardRequest& fr, std::string_view request_id,
                             int version, bool chunked, std::optional<std::uint64_t> content_length,
                             bool keep_alive, std::string& out,
                             CapturedResponse& captured, bool capture) {
  out.clear();
  AppendStatusLine(out, version, res.result_int(), View(res.reason()));
  if (capture) {
    std::size_t fields = fr.add_response_headers.size();  // at most this many are captured
    for (auto it = res.begin(); it != res.end(); ++it) ++fields;
    captured.response.status = static_cast<int>(res.result_int());
    captured.response.headers.reserve(fields);
  }
  bool dated = false;
  ForEachRelayedField(
      res, fr, request_id,
      [&](std::string_view name, std::string_view value, bhttp::field known) {
        if (known == bhttp::field::date) dated = true;
        AppendField(out, name, value);
        if (capture) captured.response.headers.push_back({std::string(name), std::string(value)});
      },
      [&](std::string_view name, std::string_view value) {
        captured.stripped.push_back({std::string(name), std::string(value)});
      });
  // RFC 9110 section 6.6.1: a response forwarded without a Date gets one.
  // Not captured: a replay dates itself.
  if (!dated) AppendField(out, "Date", CurrentHttpDate());
  if (content_length && !chunked && res.result_int() != 204) {
    AppendNumberField(out, "Content-Length", *content_length);
    // Captured where the client sees it, for a replay to frame its body at
    // the same place (and, answering HEAD, to send the length a GET would get).
    if (capture) captured.response.headers.push_back({"Content-Length", std::to_string(*content_length)});
  }
  for (const Header& h : fr.add_response_headers) {
    AppendField(out, h.name, h.value);
    if (capture) captured.response.headers.push_back(h);
  }
  if (!request_id.empty()) AppendField(out, "X-Request-Id", request_id);
  if (chunked) AppendField(out, "Transfer-Encoding", "chunked");
  if (!keep_alive && version != 10) AppendField(out, "Connection", "close");
  if (keep_alive && version == 10) AppendField(out, "Connection", "keep-alive");
  out.append(kCrlf);
}

void CaptureBody(const char* data, std::size_t n, std::uint64_t cap, core::StoredResponse& out) {
  if (out.body_omitted || n == 0) return;
  if (out.body.size() + n > cap) {
    out.body_omitted = true;
    out.body.clear();
    out.body.shrink_to_fit();
    return;
  }
  out.body.append(data, n);
}

// RFC 9110 section 9.2.2: a request with one of these methods may be sent
// again after a connection failed before its answer, since repeating it has
// the effect of sending it once. Anything else (POST, PATCH) is not, and
// that is the case the gateway exists for.
bool IsIdempotentMethod(std::string_view method) {
  switch (method.size()) {
    case 3: return method == "GET" || method == "PUT";
    case 4: return method == "HEAD";
    case 5: return method == "TRACE";
    case 6: return method == "DELETE";
    case 7: return method == "OPTIONS";
    default: return false;
  }
}

bool IsStaleConnectionError(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted ||
         ec == asio::ssl::error::stream_truncated;
}

// True when `bytes`, what the upstream sent while the request was still
// going out, hold nothing but interim (1xx) response heads, the last one
// perhaps not whole yet: the upstream still expects the rest of the request
// (a server may send 100 Continue unasked, RFC 9110 section 15.2.1).
// Anything else is the start of its answer, or bytes the response parser
// will refuse.
bool OnlyInterimResponses(std::string_view bytes) {
  static constexpr std::string_view kStart = "HTTP/1.x 1";
  while (!bytes.empty()) {
    for (std::size_t i = 0; i < kStart.size() && i < bytes.size(); ++i) {
      if (i == 7 ? (bytes[i] != '0' && bytes[i] != '1') : bytes[i] != kStart[i]) return false;
    }
    if (bytes.size() >= 12 && bytes.substr(9, 3) == "101") return false;  // an upgrade answers (refused)
    const std::size_t end = bytes.find("\r\n\r\n");
    if (end == std::string_view::npos) return true;
    bytes.remove_prefix(end + 4);
  }
  return true;
}

// True when `buffer`, what an https upstream sent while the request was
// still going out, holds the start of its answer (or more than a head may
// be): TlsSendToUpstream stops the send then, as SendToUpstream does.
bool UpstreamAnswered(const beast::flat_buffer& buffer) {
  const auto data = buffer.data();
  return buffer.size() > kUpstreamHeaderLimit ||
         !OnlyInterimResponses(std::string_view(static_cast<const char*>(data.data()), data.size()));
}

// The status of the response whose head `up` was reading when that failed,
// once a whole status line came: the parsed one, or, when the parser never
// got to it (it waits for the whole header block, which may have broken off
// or run past the limit), the status line at the front of `buffer`. 0 when
// no status line came whole. Forward sets the message's status to 0 before
// parsing (Beast's message starts as 200).
unsigned StatusLineReceived(const ResponseParser& up, const beast::flat_buffer& buffer, const Pump& pump) {
  if (up.get().result_int() != 0 || pump.header_bytes != 0) return up.get().result_int();
  const auto data = buffer.data();
  const std::string_view bytes(static_cast<const char*>(data.data()),
                               std::min<std::size_t>(data.size(), kUpstreamHeaderLimit));
  // A bare LF ends the line too (RFC 9112 section 2.2 lets a recipient take
  // it): Beast refuses such a head, but its status says the upstream acted.
  const std::size_t eol = bytes.find('\n');
  if (eol == std::string_view::npos) return 0;
  std::string_view line = bytes.substr(0, eol);
  if (line.ends_with('\r')) line.remove_suffix(1);
  // HTTP-version SP 3DIGIT [SP reason-phrase], as Beast reads it.
  if (line.size() < 12 || !(line.starts_with("HTTP/1.1 ") || line.starts_with("HTTP/1.0 "))) return 0;
  unsigned status = 0;
  for (std::size_t i = 9; i < 12; ++i) {
    if (line[i] < '0' || line[i] > '9') return 0;
    status = status * 10 + static_cast<unsigned>(line[i] - '0');
  }
  if (line.size() > 12 && line[12] != ' ') return 0;
  if (FieldControlCharacterAt(line.substr(12)) != std::string_view::npos) return 0;
  return status;
}

// Finds the end of an upstream's head as its bytes arrive, and whether it
// needs RepairUpstreamHead, looking at each byte once (a head dribbled in
// byte by byte costs no rescans). The parser is shown the head only once it
// is whole: Beast consumes the status line and each field as it parses them,
// and a head is mended only before any of it was consumed.
struct HeadScan {
  std::size_t offset = 0;                    // bytes of the buffer looked at
  std::size_t end = std::string_view::npos;  // just past the empty line ending the head
  bool mend = false;                         // a bare LF, or "HTTP/1.x DDD" alone on the status line
  void Advance(const beast::flat_buffer& buffer, std::size_t limit) {
    const auto data = buffer.data();
    const std::string_view bytes(static_cast<const char*>(data.data()), std::min(data.size(), limit));
    while (end == std::string_view::npos) {
      const std::size_t lf = bytes.find('\n', offset);
      if (lf == std::string_view::npos) {
        offset = bytes.size();
        return;
      }
      const bool first = offset == 0;
      offset = lf + 1;
      const bool cr = lf > 0 && bytes[lf - 1] == '\r';
      const std::size_t line_end = cr ? lf - 1 : lf;
      if (!cr || (first && line_end == 12 && bytes.starts_with("HTTP/1."))) mend = true;
      if (line_end > 0 && bytes[line_end - 1] == '\n') end = lf + 1;
    }
  }
};

// Two things RFC 9112 lets a recipient accept, and nginx accepts from an
// upstream, that Beast's parser refuses: a line ended by a bare LF (section
// 2.2: a recipient MAY take a single LF as a line terminator and ignore a
// preceding CR) and a status line that ends right after its code, without
// the space before an empty reason phrase ("HTTP/1.1 200"). Rewrites the
// `head_end` bytes of head at the front of `buffer` with CRLF line ends and
// that space, leaving the body after it untouched; false when there was
// nothing to mend. Only for the upstream's side: on a client's request,
// leniency about framing is what request smuggling relies on (server.cc
// stays strict). A head that still holds something Beast refuses (a bare CR
// within a line, a malformed field) is refused as before.
bool RepairUpstreamHead(beast::flat_buffer& buffer, std::size_t head_end) {
  const auto data = buffer.data();
  const std::string_view all(static_cast<const char*>(data.data()), data.size());
  std::string mended;
  mended.reserve(all.size() + 32);
  for (std::size_t pos = 0; pos < head_end;) {
    const std::size_t lf = all.find('\n', pos);
    std::string_view line = all.substr(pos, lf - pos);
    if (line.ends_with('\r')) line.remove_suffix(1);
    mended.append(line);
    if (pos == 0 && line.size() == 12 && (line.starts_with("HTTP/1.1 ") || line.starts_with("HTTP/1.0 "))) {
      mended.push_back(' ');
    }
    mended.append("\r\n");
    pos = lf + 1;
  }
  if (mended == all.substr(0, head_end)) return false;
  mended.append(all.substr(head_end));
  buffer.consume(buffer.size());
  const auto out = buffer.prepare(mended.size());
  std::memcpy(out.data(), mended.data(), mended.size());
  buffer.commit(mended.size());
  return true;
}

// Sends the rest of `iov` to a plain-text upstream whose socket is full
// (TrySend came back false). While it stays full, waits for room and for
// bytes from the upstream at once: an upstream that answers before it has
// read the whole request (an early 401 or 413) may never read the rest.
// Bytes other than interim responses, or the upstream's end, stop the send
// with `answered` set; they stay in conn.buffer for the response parser.
Task<error_code> SendToUpstream(UpstreamConnection& conn, IoVec& iov, bool& answered) {
  error_code ec;
  do {
    bool readable = false;
    ec = co_await WaitWritableOrReadable(conn.socket, conn.deadline, readable);
    if (ec) co_return ec;
    if (!readable) continue;
    error_code read_ec;
    std::size_t n = 0;
    if (!ReceiveNow(conn.socket, conn.buffer.prepare(kHeaderReadSize), read_ec, n)) continue;
    conn.buffer.commit(n);
    const auto data = conn.buffer.data();
    if (read_ec || conn.buffer.size() > kUpstreamHeaderLimit ||
        !OnlyInterimResponses(std::string_view(static_cast<const char*>(data.data()), data.size()))) {
      answered = true;
      co_return error_code{};
    }
  } while (!TrySend(conn.socket, iov, ec));
  co_return ec;
}

// True when a response has no Transfer-Encoding, or exactly "chunked" and
// no Content-Length.
bool OnlyChunkedTransferEncoding(const ResponseMessage& res) {
  std::size_t chunked = 0;
  bool present = false;
  for (const auto& f : res) {
    if (f.name() != bhttp::field::transfer_encoding) continue;
    present = true;
    for (const std::string_view coding : SplitList(View(f.value()))) {
      if (!NameEquals(coding, "chunked")) return false;
      ++chunked;
    }
  }
  return !present || (chunked == 1 && res.count(bhttp::field::content_length) == 0);
}

// One piece of a body for the wire: `data` framed as a chunk when
// `chunked`, the last chunk added when `last`.
struct PieceFrame {
  char chunk_header[24];
};

void AddPiece(IoVec& iov, PieceFrame& frame, const char* data, std::size_t n, bool chunked, bool last) {
  if (!chunked) {
    iov.Add(data, n);
    return;
  }
  if (n > 0) {
    iov.Add(ChunkHeader(n, frame.chunk_header));
    iov.Add(data, n);
    iov.Add(kCrlf);
  }
  if (last) iov.Add(kLastChunk);
}

// Response bytes owed to a client that reads slower than the upstream
// sends, framed for the wire, oldest first.
class Backlog {
 public:
  bool empty() const { return sent_ == bytes_.size(); }
  std::size_t size() const { return bytes_.size() - sent_; }
  std::string_view pending() const { return std::string_view(bytes_).substr(sent_); }
  // Queues what is left of `iov`.
  void Append(const IoVec& iov) {
    if (sent_ > 0 && sent_ >= bytes_.size() / 2) {  // amortised: each byte moves at most once
      bytes_.erase(0, sent_);
      sent_ = 0;
    }
    for (const asio::const_buffer& b : iov.buffers()) bytes_.append(static_cast<const char*>(b.data()), b.size());
  }
  void Consume(std::size_t n) {
    sent_ += n;
    if (sent_ == bytes_.size()) Clear();
  }
  void Clear() {
    bytes_.clear();
    sent_ = 0;
  }
  void Release(std::size_t keep) {
    Clear();
    if (bytes_.capacity() > keep) std::string().swap(bytes_);
  }

 private:
  std::string bytes_;
  std::size_t sent_ = 0;
};

// Sends what the socket takes now from the front of `backlog`. Returns a
// hard error; a full socket is not one.
error_code TrySendBacklog(tcp::socket& socket, Backlog& backlog) {
  const std::size_t before = backlog.size();
  IoVec iov;
  iov.Add(backlog.pending());
  error_code ec;
  TrySend(socket, iov, ec);
  std::size_t left = 0;
  for (const asio::const_buffer& b : iov.buffers()) left += b.size();
  backlog.Consume(before - left);
  return ec;
}

// The per-exchange state of Forward that is not needed across requests,
// kept out of its coroutine frame (so the frame stays small enough for the
// allocators' fast paths) and recycled per worker thread.
struct ProxyScratch {
  std::string request_head;
  std::string response_head;
  std::string tls_out;  // what one send to a TLS upstream carries, joined
  std::optional<ResponseParser> response;
  CapturedResponse captured;
  // What a slow client is owed; see the relay in Forward.
  Backlog backlog;

  void Reset() {
    response.reset();
    captured = {};
    backlog.Release(kKeepBytes);
    if (request_head.capacity() > kKeepBytes) std::string().swap(request_head);
    if (response_head.capacity() > kKeepBytes) std::string().swap(response_head);
    if (tls_out.capacity() > kKeepBytes) std::string().swap(tls_out);
  }
  static constexpr std::size_t kKeepBytes = 16 * 1024;
};

// Lends a ProxyScratch from the calling thread's free list.
class ScratchLease {
 public:
  ScratchLease() {
    auto& list = FreeList();
    if (list.empty()) {
      scratch_ = std::make_unique<ProxyScratch>();
    } else {
      scratch_ = std::move(list.back());
      list.pop_back();
    }
  }
  ~ScratchLease() {
    scratch_->Reset();
    auto& list = FreeList();
    if (list.size() < kMaxFree) list.push_back(std::move(scratch_));
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ProxyScratch& operator*() { return *scratch_; }

 private:
  static constexpr std::size_t kMaxFree = 64;
  static std::vector<std::unique_ptr<ProxyScratch>>& FreeList() {
    thread_local std::vector<std::unique_ptr<ProxyScratch>> list;
    return list;
  }
  std::unique_ptr<ProxyScratch> scratch_;
};

}  // namespace

void ExchangeImpl::Fail(ForwardResult& result, ForwardOutcome outcome) {
  result.outcome = outcome;
  c_.must_close = true;
}

Task<ForwardResult> ExchangeImpl::Forward(UpstreamPool& pool, const ForwardRequest& fr) {
  ForwardResult result;
  if (forwarded_ || responded_) {
    result.outcome = ForwardOutcome::kBadRequest;
    co_return result;
  }
  forwarded_ = true;
  UpstreamPool::Impl& p = pool.impl();
  const UpstreamTarget& target = p.target;
  ScratchLease lease;
  ProxyScratch& s = *lease;
  Block block(c_.w.blocks);
  const auto started = SteadyClock::now();

  // Every failure that still owes the client an answer records its problem
  // here and leaves the do-while; the one co_await after it sends it.
  std::optional<ProblemCode> problem;
  auto fail = [&](ForwardOutcome outcome, ProblemCode code) {
    result.outcome = outcome;
    problem = code;
  };
  auto body_failure = [&](BodyStatus status) {
    if (status == BodyStatus::kTooLarge) {
      detail_ = "the request body exceeds " + std::to_string(body_limit_) + " bytes";
      fail(ForwardOutcome::kRequestTooLarge, ProblemCode::kRequestTooLarge);
    } else if (status == BodyStatus::kMalformed) {
      detail_ = "malformed request body";
      fail(ForwardOutcome::kBadRequest, ProblemCode::kBadRequest);
    } else if (body_timed_out_) {
      // The client stalled past idle_timeout (ReadBodyPiece): 408, close.
      detail_ = BodyTimeoutDetail();
      fail(ForwardOutcome::kClientGone, ProblemCode::kRequestTimeout);
    } else {
      // The client ended or broke its side before the body was whole. One
      // that only half-closed still reads: it gets the same answer as when
      // a buffered body falls short, instead of no answer at all.
      detail_ = "the request body did not arrive";
      fail(ForwardOutcome::kClientGone, ProblemCode::kBadRequest);
    }
  };
  std::unique_ptr<UpstreamConnection> conn;
  SteadyClock::time_point upstream_started = started;
  SteadyClock::time_point upstream_ended{};

  do {
    // The request body: buffered by ReadBody, or its first block read now, so
    // that a small body goes out in the same send as the head and a body
    // over a small limit is refused before the upstream is contacted.
    const char* first_data = nullptr;
    std::size_t first_size = 0;
    bool body_complete = true;
    std::optional<std::size_t> buffered_size;
    if (body_state_ == BodyState::kBuffered) {
      first_data = body_.data();
      first_size = body_.size();
      buffered_size = body_.size();
    } else if (body_state_ == BodyState::kUnread) {
      if (c_.head.content_length && *c_.head.content_length > body_limit_) {
        body_state_ = BodyState::kFailed;
        c_.must_close = true;
        c_.linger = true;
        body_failure(BodyStatus::kTooLarge);
        break;
      }
      if (c_.head.expect_continue && !continue_sent_ && !co_await SendContinueIfNeeded()) {
        Fail(result, ForwardOutcome::kClientGone);
        break;
      }
      parser_.LimitBody(body_limit_, limits_.max_header_bytes);
      const PieceResult piece = co_await ReadBodyPiece(block.data(), block.size(), true);
      if (piece.status != BodyStatus::kOk) {
        body_failure(piece.status);
        break;
      }
      first_data = block.data();
      first_size = piece.bytes;
      body_complete = parser_.is_done();
      body_state_ = BodyState::kStreamed;
    } else if (body_state_ != BodyState::kNone) {
      Fail(result, ForwardOutcome::kClientGone);
      break;
    }
    result.request_body_bytes = first_size;
    const Framing framing =
        WriteUpstreamRequestHead(parser_.get(), c_.head, fr, target, buffered_size, s.request_head);
    const bool chunked_out = framing == Framing::kChunked;

    // A non-idempotent request is never sent twice: it is sent again only
    // when the first send failed (the upstream cannot have had the whole
    // request), not when the connection broke after the request went out,
    // since the upstream may have acted on it before it went away.
    // Both methods count: an upstream that reads a method override header
    // runs the request as the method it names, one that does not as sent.
    // A request with an observer holds a reservation under its key: the
    // gateway promises it runs once, so it is never sent a second time on
    // its own, whatever the method (the client retries under its key).
    const bool idempotent = fr.observer == nullptr && IsIdempotentMethod(c_.head.method) &&
                            IsIdempotentMethod(c_.head.effective_method());
    bool fresh_only = false;
    bool failed = false;
    bool cut_short = false;  // the upstream answered or went away before it took the whole request
    bool probe_reads = false;  // TLS: reads try TlsReadNow before they wait (TlsSendToUpstream)
    error_code ec;
    // Past shutdown_grace nothing goes upstream any more: every exchange is
    // being cut, so a request sent now would run there unanswered (and one
    // whose original was cut a moment ago would run twice). Checked again
    // once a connection is in hand: the watchdog cuts a connect, not a send
    // that starts between its ticks. ForwardProblem answers 503.
    const auto stopping = [&] {
      if (!c_.w.watchdog.killing()) return false;
      fail(ForwardOutcome::kShutdown, ProblemCode::kShuttingDown);
      failed = true;
      return true;
    };
    // A request with a finish_by (a keyed one: its lease) is sent only while
    // the upstream's whole timeout still fits before it, so that the
    // exchange ends inside the lease: the wait for a free connection and the
    // connect stop at send_by, and a connection in hand after it is not used.
    // Nothing was sent: 502, and the key is released.
    const SteadyClock::time_point send_by =
        fr.finish_by == SteadyClock::time_point::max() ? fr.finish_by : fr.finish_by - target.timeout;
    const auto too_late = [&] {
      const auto now = SteadyClock::now();
      if (now <= send_by) return false;
      const auto left = std::max(send_by, started) - started;
      detail_ = "the request was not sent: no upstream connection became free within the " +
                std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) +
                "ms left to send it inside its idempotency key's lease";
      fail(ForwardOutcome::kConnectFailed, ProblemCode::kUpstreamUnavailable);
      if (!body_complete) {
        c_.must_close = true;  // the rest of the client's body is unread
        c_.linger = true;
      }
      failed = true;
      return true;
    };
    for (int attempt = 0;; ++attempt) {
      if (stopping() || too_late()) break;
      Acquired acquired;
      if (!fresh_only) acquired.connection = p.TakeIdle();
      if (!acquired.connection) acquired = co_await p.Acquire(fresh_only, send_by);
      if (acquired.connection && stopping()) {
        p.Release(std::move(acquired.connection), false);
        break;
      }
      if (acquired.connection && too_late()) {
        p.Release(std::move(acquired.connection), true);  // unused: another request may have it
        break;
      }
      if (!acquired.connection) {
        detail_ = std::move(acquired.error);
        fail(ForwardOutcome::kConnectFailed, ProblemCode::kUpstreamUnavailable);
        if (!body_complete) {
          c_.must_close = true;  // the rest of the client's body is unread
          c_.linger = true;
        }
        failed = true;
        break;
      }
      conn = std::move(acquired.connection);
      if (!result.upstream_contacted) upstream_started = acquired.since;  // not the wait for a free connection
      result.upstream_contacted = true;
      // A reused connection that fails before any response byte was probably
      // closed by the upstream while idle: the request is sent again, once,
      // on a fresh connection, if it is still whole in memory.
      const bool replayable = conn->reused && attempt == 0 && body_complete;
      conn->deadline.ExpireAfter(target.timeout);
      // An upstream may answer before it has read the whole request (an
      // early 401 or 413, or a handler that ignores the body), then close,
      // which fails the send, or stop reading, which blocks it. Its answer
      // is read then, as any other, and the rest of the request is not
      // sent: the request was cut short (`send_ec`: the send's error, if it
      // failed; `body_send`: a body block's send, not the head's).
      cut_short = false;
      error_code send_ec;
      bool body_send = false;

      {
        IoVec iov;
        PieceFrame frame;
        iov.Add(s.request_head);
        if (framing != Framing::kNone) AddPiece(iov, frame, first_data, first_size, chunked_out, body_complete);
        if (conn->tls) {
          ec = co_await TlsSendToUpstream(*conn, iov, s.tls_out, &UpstreamAnswered, cut_short, probe_reads);
        } else if (!TrySend(conn->socket, iov, ec)) {
          ec = co_await SendToUpstream(*conn, iov, cut_short);
        }
      }
      if (conn->deadline.fired()) {
        p.Release(std::move(conn), false);
        if (!body_complete) {
          c_.must_close = true;
          c_.linger = true;
        }
        detail_ = "the upstream did not accept the request in time";
        fail(ForwardOutcome::kTimedOut, ProblemCode::kUpstreamTimeout);
        failed = true;
        break;
      }
      if (ec) {
        cut_short = true;
        send_ec = std::exchange(ec, error_code{});
      }

      // The rest of a streamed body, block by block.
      while (!body_complete && !cut_short) {
        const PieceResult piece = co_await ReadBodyPiece(block.data(), block.size(), false);
        if (piece.status != BodyStatus::kOk) {
          p.Release(std::move(conn), false);
          body_failure(piece.status);
          failed = true;
          break;
        }
        body_complete = parser_.is_done();
        result.request_body_bytes += piece.bytes;
        IoVec iov;
        PieceFrame frame;
        AddPiece(iov, frame, block.data(), piece.bytes, chunked_out, body_complete);
        if (conn->tls) {
          ec = co_await TlsSendToUpstream(*conn, iov, s.tls_out, &UpstreamAnswered, cut_short, probe_reads);
        } else if (!TrySend(conn->socket, iov, ec)) {
          ec = co_await SendToUpstream(*conn, iov, cut_short);
        }
        if (conn->deadline.fired()) {
          p.Release(std::move(conn), false);
          c_.must_close = true;
          c_.linger = !body_complete;
          detail_ = "the upstream did not accept the request body in time";
          fail(ForwardOutcome::kTimedOut, ProblemCode::kUpstreamTimeout);
          failed = true;
          break;
        }
        if (ec) {
          cut_short = true;
          send_ec = std::exchange(ec, error_code{});
        }
        body_send = cut_short;
      }
      if (failed) break;
      if (cut_short && !body_complete) {
        // The rest of the client's body stays unread: the client connection
        // closes after the answer, lingering so that a client still sending
        // gets it.
        c_.must_close = true;
        c_.linger = true;
      }

      // The response head; interim 1xx responses are skipped. After a cut
      // short request it is whatever the upstream sent before it stopped
      // reading or went away, so the first read does not wait: a reset
      // right behind those bytes raises no further epoll edge.
      bool retry = false;
      bool nothing_received = false;  // on failure: no byte of a response came
      unsigned answered = 0;          // on failure: the final status of a head that was refused or broke off
      bool interim_seen = false;
      bool interim_refused = false;  // the client did not take an interim response
      for (;;) {
        s.response.reset();
        ResponseParser& up = s.response.emplace();
        up.header_limit(kUpstreamHeaderLimit);
        up.body_limit(boost::none);
        if (c_.head.method == "HEAD") up.skip(true);
        up.get().result(0);  // no status line yet (StatusLineReceived)
        Pump pump;
        HeadScan scan;
        for (bool partial = cut_short;; partial = true) {
          if (pump.header_bytes == 0 && scan.end == std::string_view::npos) {
            scan.Advance(conn->buffer, kUpstreamHeaderLimit);
            if (scan.end != std::string_view::npos && scan.mend) RepairUpstreamHead(conn->buffer, scan.end);
          }
          // Once the parser has taken part of the head (a block past the
          // limit is parsed as far as it goes), it is shown every byte.
          if (pump.header_bytes != 0 || scan.end != std::string_view::npos ||
              conn->buffer.size() >= kUpstreamHeaderLimit) {
            ParseHeader(up, conn->buffer, kUpstreamHeaderLimit, pump);
          } else {
            pump.need_more = true;  // the head is not whole yet
          }
          if (!pump.need_more) break;
          error_code read_ec;
          std::size_t n = 0;
          if (conn->tls) {
            if (!probe_reads || !TlsReadNow(*conn->tls, conn->buffer.prepare(kHeaderReadSize), read_ec, n)) {
              n = co_await TlsReadSome(*conn->tls, conn->buffer.prepare(kHeaderReadSize), read_ec);
            }
          } else if (!partial || !ReceiveNow(conn->socket, conn->buffer.prepare(kHeaderReadSize), read_ec, n)) {
            std::tie(read_ec, n) =
                co_await conn->socket.async_read_some(DrainAwareBuffer(conn->buffer.prepare(kHeaderReadSize)), kTuple);
          }
          if (conn->deadline.fired()) break;
          if (!OnReceive(up, conn->buffer, read_ec, n, pump)) break;
        }
        ec = pump.ec;
        if (ec || conn->deadline.fired()) {
          const bool fired = conn->deadline.fired();
          nothing_received = !interim_seen && pump.header_bytes == 0 && conn->buffer.size() == 0;
          if (cut_short) {
            // The upstream cannot have had the whole request: sent again
            // whatever the method, as when the send itself failed.
            retry = replayable && !fired && nothing_received && IsStaleConnectionError(send_ec ? send_ec : ec);
          } else {
            retry = replayable && idempotent && !fired && nothing_received && IsStaleConnectionError(ec);
          }
          answered = StatusLineReceived(up, conn->buffer, pump);
          if (!ec) ec = asio::error::timed_out;
          break;
        }
        const unsigned status = up.get().result_int();
        if (status < 100 || status > 599) {
          // The parser takes any three digits; RFC 9110 section 15 defines
          // 100..599, and a client or the record store has no meaning for
          // the rest.
          ec = bhttp::error::bad_status;
          break;
        }
        if (status == 101) {
          ec = bhttp::error::bad_status;  // upgrades are not proxied
          break;
        }
        if (status >= 200 && !OnlyChunkedTransferEncoding(up.get())) {
          // RFC 9112 section 6.3: Transfer-Encoding beside Content-Length
          // is an error, and a coding the gateway does not decode ("gzip",
          // "gzip, chunked") would reach the client silently removed, since
          // Transfer-Encoding is hop-by-hop. The request side refuses the
          // same (server.cc).
          ec = bhttp::error::bad_transfer_encoding;
          answered = status;
          break;
        }
        if (status >= 200) break;
        interim_seen = true;
        // RFC 9110 section 15.2: interim responses the gateway did not ask
        // for (102, 103 Early Hints, ...) go on to an HTTP/1.1 client, their
        // hop-by-hop fields dropped; a 100 answers the Expect the gateway
        // answered itself. Never stored or replayed. A client that does not
        // take one is noticed with the final response.
        if (status != 100 && c_.head.version == 11 && !interim_refused) {
          // Its fields filtered as the final head's (a 1xx has no body to
          // frame, and what the gateway strips is not passed on).
          std::string interim;
          AppendStatusLine(interim, 11, status, View(up.get().reason()));
          ForEachRelayedField(
              up.get(), fr, c_.request_id,
              [&](std::string_view name, std::string_view value, bhttp::field) { AppendField(interim, name, value); },
              [](std::string_view, std::string_view) {});
          interim.append(kCrlf);
          if (!co_await SendInterim(interim)) {
            // Part of the head may be out: nothing more may follow it. The
            // client's side is shut, so every later write fails and the
            // exchange goes on as with a client gone (the response is still
            // read, and stored for a keyed request).
            interim_refused = true;
            c_.must_close = true;
            error_code ignored;
            c_.socket.shutdown(tcp::socket::shutdown_send, ignored);
          }
        }
      }
      if (retry) {
        p.Release(std::move(conn), false);
        fresh_only = true;
        result.retried = true;
        continue;
      }
      if (ec) {
        const bool fired = conn->deadline.fired();
        p.Release(std::move(conn), false);
        if (answered >= 200 && answered <= 599) {
          // The upstream answered with a final status, so it ran the
          // request, but the rest of its head was refused (a framing the
          // gateway does not relay, a block past the limit) or did not
          // come. The observer learns the status alone, the body marked
          // omitted, as when a body breaks off (below), so that the outcome
          // is classified instead of the key released for a second run.
          // The client gets the error.
          result.upstream_status = static_cast<int>(answered);
          if (fr.observer != nullptr) {
            result.captured = true;
            s.captured.response.status = result.upstream_status;
            s.captured.response.headers.clear();
            s.captured.response.body.clear();
            s.captured.response.body_omitted = true;
            s.captured.timed_out = fired;
            co_await fr.observer->OnResponse(s.captured);
          }
        }
        if (body_send) c_.must_close = true;
        if (fired) {
          detail_ = "the upstream did not answer within " + std::to_string(target.timeout.count()) + "ms";
          fail(ForwardOutcome::kTimedOut, ProblemCode::kUpstreamTimeout);
        } else if (cut_short && nothing_received) {
          if (send_ec) {
            detail_ = (body_send ? "sending the request body to the upstream failed: "
                                 : "sending the request to the upstream failed: ") +
                      send_ec.message();
          } else {
            detail_ = "the upstream closed the connection before it took the whole request";
          }
          fail(ForwardOutcome::kUpstreamFailed, ProblemCode::kUpstreamUnavailable);
        } else {
          detail_ = "the upstream closed the connection or answered with malformed HTTP: " + ec.message();
          fail(ForwardOutcome::kUpstreamFailed, ProblemCode::kUpstreamUnavailable);
        }
        failed = true;
      }
      break;
    }
    if (failed) break;

    // Relay the response.
    ResponseParser& up = *s.response;
    ResponseMessage& res = up.get();
    result.upstream_status = static_cast<int>(res.result_int());
    const bool upstream_keep_alive = up.keep_alive();
    const bool upstream_to_eof = up.need_eof();
    ForwardObserver* observer = fr.observer;
    const int version = c_.head.version == 10 ? 10 : 11;
    bool client_close = !c_.head.keep_alive || c_.must_close || c_.w.draining;
    bool chunked_back = false;
    const bool bodiless = c_.head.method == "HEAD" || result.upstream_status == 204 || result.upstream_status == 304;
    if (!bodiless && (up.chunked() || upstream_to_eof)) {
      if (version == 10) {
        client_close = true;  // HTTP/1.0: the body ends when the connection does
      } else {
        chunked_back = true;
      }
    }
    std::optional<std::uint64_t> content_length;
    if (const auto length = up.content_length()) content_length = *length;
    WriteClientResponseHead(res, fr, c_.request_id, version, chunked_back, content_length, !client_close,
                            s.response_head, s.captured, observer != nullptr);

    bool head_sent = false;
    bool client_gone = false;
    bool upstream_failed = false;
    bool upstream_timed_out = false;
    bool cut_at_finish_by = false;  // the last wait for the body ended at finish_by, not the timeout
    // Read-ahead (ForwardRequest::read_ahead_bytes): when the client's
    // socket is full, the relay keeps reading the upstream and queues what
    // the client is owed in s.backlog instead of waiting for the client. A
    // response that fits is then read whole at the upstream's pace: a keyed
    // one is recorded (its lease no longer matters) and the upstream
    // connection goes back to the pool before the slow client has it all.
    // Plain-text clients only: a TLS write cannot be tried without waiting.
    Backlog& backlog = s.backlog;
    const std::uint64_t read_ahead =
        c_.tls ? 0 : std::max(fr.read_ahead_bytes, observer != nullptr ? fr.capture_max_body_bytes : 0);
    // A wait for the client before the upstream's response is whole (so
    // before a keyed one is recorded) ends by finish_by too: a relay paced
    // by a stalled client must not outlive the key's lease, or a retry
    // could take the key over and run the request again while this one is
    // still going out. The client is then cut, and the upstream's response
    // still read to the end for the observer.
    auto client_deadline = [&](bool response_whole) {
      const SteadyClock::time_point idle = SteadyClock::now() + limits_.idle_timeout;
      c_.deadline.ExpireAt(response_whole ? idle : std::min(idle, fr.finish_by));
    };
    auto send_backlog = [&](bool response_whole) -> Task<error_code> {
      // Waits for the client slice by slice; idle_timeout bounds each wait.
      error_code send_ec;
      while (!backlog.empty() && !send_ec) {
        IoVec iov;
        const std::size_t slice = std::min<std::size_t>(backlog.size(), kBodyReadSize);
        iov.Add(backlog.pending().substr(0, slice));
        client_deadline(response_whole);
        send_ec = co_await SendAll(c_.socket, c_.deadline, iov);
        if (c_.deadline.fired()) send_ec = asio::error::timed_out;
        c_.deadline.Disarm();
        if (!send_ec) backlog.Consume(slice);
      }
      co_return send_ec;
    };
    for (;;) {
      std::size_t n = 0;
      if (!up.is_done()) {
        res.body().data = block.data();
        res.body().size = block.size();
        Pump pump;
        for (;;) {
          ParseBody(up, conn->buffer, block.size(), false, kUpstreamHeaderLimit, pump);
          if (!pump.need_more) break;
          // Once the head is in, the timeout bounds the upstream's silence
          // while it sends the body, counted from each wait for it: time
          // spent writing to a slow client is not the upstream's.
          const SteadyClock::time_point silence_ends = SteadyClock::now() + target.timeout;
          cut_at_finish_by = fr.finish_by < silence_ends;
          conn->deadline.ExpireAt(std::min(silence_ends, fr.finish_by));
          error_code read_ec;
          std::size_t got = 0;
          if (conn->tls) {
            if (!probe_reads || !TlsReadNow(*conn->tls, conn->buffer.prepare(kBodyReadSize), read_ec, got)) {
              got = co_await TlsReadSome(*conn->tls, conn->buffer.prepare(kBodyReadSize), read_ec);
            }
          } else if (!ReceiveNow(conn->socket, conn->buffer.prepare(kBodyReadSize), read_ec, got)) {
            // Every read here follows one that left the body incomplete.
            std::tie(read_ec, got) =
                co_await conn->socket.async_read_some(DrainAwareBuffer(conn->buffer.prepare(kBodyReadSize)), kTuple);
          }
          if (conn->deadline.fired()) break;
          if (!OnReceive(up, conn->buffer, read_ec, got, pump)) break;
        }
        n = pump.bytes;
        if (pump.ec || conn->deadline.fired()) {
          upstream_timed_out = conn->deadline.fired();
          upstream_failed = true;
          break;
        }
        result.response_body_bytes += n;
        if (observer != nullptr) CaptureBody(block.data(), n, fr.capture_max_body_bytes, s.captured.response);
      }
      const bool done = up.is_done();
      if (done && observer != nullptr && !result.captured) {
        result.captured = true;
        co_await observer->OnResponse(s.captured);
      }
      if (done && fr.on_complete != nullptr) fr.on_complete(fr.on_complete_arg);
      if (!client_gone) {
        IoVec iov;
        PieceFrame frame;
        if (!head_sent) iov.Add(s.response_head);
        if (!bodiless) AddPiece(iov, frame, block.data(), n, chunked_back, done);
        error_code send_ec;
        if (!backlog.empty()) {
          // The client is behind: queue this piece after what it is owed,
          // and give it what its socket takes now.
          backlog.Append(iov);
          send_ec = TrySendBacklog(c_.socket, backlog);
          // Past the read-ahead the relay waits for the client again; the
          // rest of a response that is whole waits until the upstream
          // connection is back in the pool (after the loop).
          if (!send_ec && !done && backlog.size() > read_ahead) send_ec = co_await send_backlog(false);
        } else if (!iov.empty()) {
          if (c_.tls) {
            client_deadline(done);
            send_ec = co_await TlsSendAll(*c_.tls, iov, c_.tls_out);
          } else if (!TrySend(c_.socket, iov, send_ec)) {
            backlog.Append(iov);
            if (!done && backlog.size() > read_ahead) send_ec = co_await send_backlog(false);
          }
          if (c_.deadline.fired()) send_ec = asio::error::timed_out;
          c_.deadline.Disarm();
        }
        if (!head_sent) {
          head_sent = true;
          responded_ = true;
          result.response_started = true;
          // A client that reset the connection before its answer was sent
          // none: the log says so (status null), not the upstream's status.
          if (!send_ec) {
            status_sent_ = result.upstream_status;
            result.status = result.upstream_status;
          }
        }
        if (send_ec) {
          client_gone = true;
          c_.must_close = true;
          backlog.Clear();
          if (observer == nullptr) break;  // nobody needs the rest
        }
      }
      if (done) break;
    }

    if (upstream_failed) {
      p.Release(std::move(conn), false);
      if (observer != nullptr && !result.captured) {
        // The upstream answered with a status before its body broke off:
        // it ran the request. The observer gets the status and headers,
        // with the body marked omitted, and decides by the status (a final
        // one is stored, so a retry is a replay and not a second run).
        result.captured = true;
        s.captured.response.body.clear();
        s.captured.response.body_omitted = true;
        s.captured.timed_out = upstream_timed_out;
        co_await observer->OnResponse(s.captured);
      }
      if (!result.response_started) {
        // Nothing reached the client yet: a clean error instead of a torso.
        if (upstream_timed_out) {
          detail_ = cut_at_finish_by
                        ? std::string("the upstream response did not complete inside the idempotency key's lease")
                        : "the upstream response did not complete within " + std::to_string(target.timeout.count()) +
                              "ms";
          fail(ForwardOutcome::kTimedOut, ProblemCode::kUpstreamTimeout);
        } else {
          detail_ = "the upstream connection broke during the response";
          fail(ForwardOutcome::kUpstreamFailed, ProblemCode::kUpstreamUnavailable);
        }
        break;
      }
      // Part of the response is out: the client must see it cut short, never
      // a complete-looking message, so the connection closes without the
      // last chunk.
      result.outcome = client_gone ? ForwardOutcome::kClientGone
                                   : (upstream_timed_out ? ForwardOutcome::kTimedOut : ForwardOutcome::kUpstreamFailed);
      if (c_.w.watchdog.killing()) result.outcome = ForwardOutcome::kShutdown;
      c_.must_close = true;
      c_.linger = false;
      error_code ignored;
      c_.socket.shutdown(tcp::socket::shutdown_both, ignored);
      break;
    }
    // After a client left without an observer the loop stopped early and the
    // parser is not done, so the connection is not reused. Nor is it after a
    // HEAD: many upstreams answer HEAD with their GET handler and write the
    // body after the head, often in a later send that the check before reuse
    // (TakeIdle) may not yet see, and the next request on the connection
    // would take that body, which a client can choose, as its response. A
    // 204 that announces content it must not have (Content-Length or
    // Transfer-Encoding, RFC 9110 section 15.3.5) is treated alike, and so
    // is a 304 with Transfer-Encoding or a Content-Length other than 0: the
    // length of the representation a GET would get, which a handler that
    // answers 304 from its GET code path may write after the head. Other
    // 204 and 304 responses keep the connection: closing after each would
    // cost a connect (and a TIME_WAIT socket) per DELETE or conditional GET,
    // and upstreams rarely break the rule there (docs/architecture.md). Nor
    // is a connection whose request was cut short by an early answer.
    bool reusable = upstream_keep_alive && !upstream_to_eof && up.is_done() && !cut_short;
    if (reusable && c_.head.method == "HEAD") reusable = false;
    if (reusable && result.upstream_status == 204 &&
        (res.count(bhttp::field::content_length) != 0 || res.count(bhttp::field::transfer_encoding) != 0)) {
      reusable = false;
    }
    if (reusable && result.upstream_status == 304 &&
        (res.count(bhttp::field::transfer_encoding) != 0 ||
         (res.count(bhttp::field::content_length) != 0 && res[bhttp::field::content_length] != "0"))) {
      reusable = false;
    }
    p.Release(std::move(conn), reusable);
    upstream_ended = SteadyClock::now();  // the client may still be owed a backlog
    if (!backlog.empty() && co_await send_backlog(true)) {
      client_gone = true;
      c_.must_close = true;
    }
    result.outcome = client_gone ? ForwardOutcome::kClientGone : ForwardOutcome::kCompleted;
    if (client_close) c_.must_close = true;
  } while (false);

  if (upstream_ended == SteadyClock::time_point{}) upstream_ended = SteadyClock::now();
  result.upstream_duration = std::chrono::duration_cast<std::chrono::microseconds>(upstream_ended - upstream_started);
  if (problem) {
    // Let the observer settle first: a client that retries the moment it
    // has the error must find the key released.
    if (c_.w.watchdog.killing()) result.outcome = ForwardOutcome::kShutdown;
    if (fr.observer != nullptr) co_await fr.observer->OnNoResponse(result);
    co_await ForwardProblem(result, result.outcome, *problem);
  }
  co_return result;
}

}  // namespace internal
}  // namespace idemgate::http
