#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

// TLS contexts (OpenSSL through asio::ssl) for the two sides of the proxy:
// the client side of https upstreams and the server side of a TLS listener.
// A context is built from files once per config snapshot, then shared
// read-only by every worker.
namespace idemgate::http {

// Opaque: an OpenSSL SSL_CTX, TLS 1.2 or later. Thread-safe to share;
// immutable once made.
class TlsContext {
 public:
  struct Impl;
  explicit TlsContext(std::unique_ptr<Impl> impl);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct UpstreamTlsOptions {
  std::string ca_file;    // PEM bundle of trusted CAs, each an anchor (an intermediate needs no root in
                          // it); empty: the system's trust store
  std::string cert_file;  // client certificate chain (PEM); empty: none
  std::string key_file;   // its private key (PEM); set with cert_file
};

// For connections to an https upstream: the peer's certificate is always
// verified against `ca_file` (or the system's default paths). The name to
// check is set per connection (upstream_pool.cc). InvalidArgument naming the
// file and OpenSSL's reason when a file cannot be read or the key does not
// match the certificate.
StatusOr<std::shared_ptr<const TlsContext>> MakeUpstreamTls(const UpstreamTlsOptions& options);

struct ServerTlsOptions {
  std::string cert_file;       // the listener's certificate chain (PEM), leaf first
  std::string key_file;        // its private key (PEM)
  std::string client_ca_file;  // when set: clients must present a certificate signed by one of these CAs
                               // (each an anchor: an intermediate needs no root in the file)
};

// For a TLS listener: TLS 1.2 with ECDHE and AEAD suites only, or TLS 1.3.
// Errors as MakeUpstreamTls.
StatusOr<std::shared_ptr<const TlsContext>> MakeServerTls(const ServerTlsOptions& options);

// A listener's current server context, replaced on reload: connections
// accepted afterwards use the new one, open ones keep theirs. Thread-safe.
class TlsContextSlot {
 public:
  void Set(std::shared_ptr<const TlsContext> context) {
    std::lock_guard lock(mu_);
    current_ = std::move(context);
  }
  std::shared_ptr<const TlsContext> Get() const {
    std::lock_guard lock(mu_);
    return current_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const TlsContext> current_;
};

}  // namespace idemgate::http
