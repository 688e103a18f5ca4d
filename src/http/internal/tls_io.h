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

// One read from `tls` into `into`: the bytes read, the error in `ec`.
Task<std::size_t> TlsReadSome(TlsStream& tls, asio::mutable_buffer into, error_code& ec);

// A server-side session over `socket` with `context` (not yet shaken hands).
std::unique_ptr<TlsStream> NewServerTlsStream(tcp::socket& socket, const TlsContext& context);

// The handshake, as the server (a TLS listener) or as the client (an https
// upstream). A deadline cancelling the socket ends it.
Task<error_code> TlsHandshake(TlsStream& tls, bool as_server);

// Sends close_notify if the socket takes it now; never waits for the peer's.
void TlsCloseNotify(TlsStream& tls);

}  // namespace idemgate::http::internal
