#pragma once

// Reads and writes on an upstream's TLS session. Kept in a translation unit
// of their own (tls_io.cc): instantiating asio::ssl's composed operations in
// proxy.cc changed GCC's inlining there and cost the plain-http path about
// 2 % more instructions per request. Internal to src/http.

#include <cstddef>
#include <string>

#include <memory>

#include "http/internal/io.h"
#include "http/internal/upstream_impl.h"
#include "http/tls.h"

namespace idemgate::http::internal {

// Sends all of `iov` over `tls`. Several pieces are joined into `joined`
// first, so that a head and its first block of body leave as one TLS record
// and one system call instead of one of each per piece; a single piece is
// written as it is. A deadline cancelling
// the socket underneath ends the write (operation_aborted).
Task<error_code> TlsSendAll(TlsStream& tls, const IoVec& iov, std::string& joined);

// Sends all of `iov` to an https upstream as TlsSendAll does, one TLS record
// at a time. While a record waits for room (the upstream reads no more), it
// also reads from the upstream, as SendToUpstream (proxy.cc) waits for room
// and for bytes at once: an upstream that answers before it has read the
// whole request (an early 401 or 413) may never read the rest. What it reads
// goes to conn.buffer and stays there for the response parser. Once
// `answer_in(conn.buffer)` holds (more than interim responses came) the send
// stops with `answered` set, the record cut off: nothing may be written on
// the session any more, and the connection must not be reused; reading it
// goes on. The upstream's end or a failed read stops the send with that
// error. A record that goes out at once costs no read. The deadline
// cancelling the socket ends it (operation_aborted).
//
// Once a read ran beside the write, `probe_reads` is set: every later read
// of the exchange must try TlsReadNow before it waits. Asio stops trying
// receives on a socket after one that found the peer's end, and a read that
// was cancelled right after such a receive forgets it; a read that waited
// then would wait for an epoll edge that never comes again.
Task<error_code> TlsSendToUpstream(UpstreamConnection& conn, const IoVec& iov, std::string& joined,
                                   bool (*answer_in)(const beast::flat_buffer&), bool& answered, bool& probe_reads);

// One read from `tls` into `into`: the bytes read, the error in `ec`.
Task<std::size_t> TlsReadSome(TlsStream& tls, asio::mutable_buffer into, error_code& ec);

// One read from `tls` that does not wait, with the socket in non-blocking
// mode and no other operation on the session under way: false when nothing
// can be read now (the caller then waits with TlsReadSome); otherwise `n`
// and `ec` are the read's result, as TlsReadSome gives it.
bool TlsReadNow(TlsStream& tls, asio::mutable_buffer into, error_code& ec, std::size_t& n);

// A server-side session over `socket` with `context` (not yet shaken hands).
std::unique_ptr<TlsStream> NewServerTlsStream(tcp::socket& socket, const TlsContext& context);

// The handshake, as the server (a TLS listener) or as the client (an https
// upstream). A deadline cancelling the socket ends it.
Task<error_code> TlsHandshake(TlsStream& tls, bool as_server);

// Sends close_notify if the socket takes it now; never waits for the peer's.
void TlsCloseNotify(TlsStream& tls);

}  // namespace idemgate::http::internal
