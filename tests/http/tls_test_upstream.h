#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

// A tiny https upstream for in-process tests of the proxy's TLS path, on
// 127.0.0.1:0 with its own thread, serving TLS 1.2 or 1.3 with a
// certificate and key in PEM files (a TestPki's server.pem, server.key).
// Endpoints (any method, Content-Length bodies only):
//   /early?status=S   S "early" (Content-Length: 5, keep-alive) as soon as
//                     the request head is in, the body unread; then keeps
//                     the connection without reading until destroyed
//   /sink             reads the body, 200 "bytes=N fnv=H" (Fnv1a)
//   /reset            closes the connection as soon as the request head is
//                     in, without an answer (a reset, with body bytes unread)
//   ...?continue=1    (either) an unasked 100 Continue once the head is in,
//                     then 200 ms before going on
// Thread-safe accessors.
namespace idemgate::httptest {

class TlsTestUpstream {
 public:
  TlsTestUpstream(const std::string& cert_file, const std::string& key_file);
  ~TlsTestUpstream();
  TlsTestUpstream(const TlsTestUpstream&) = delete;
  TlsTestUpstream& operator=(const TlsTestUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  // TCP connections accepted.
  int connections() const { return connections_.load(); }
  // Request heads read.
  int requests() const { return requests_.load(); }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
  std::atomic<int> connections_{0};
  std::atomic<int> requests_{0};
  friend struct Impl;
};

}  // namespace idemgate::httptest
