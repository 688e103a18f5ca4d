#pragma once

#include <memory>
#include <string>

#include "common/status.h"

// The client side of TLS to an https upstream: one OpenSSL context per
// upstream and config snapshot, shared read-only by every worker's pool.
namespace idemgate::http {

struct UpstreamTlsOptions {
  std::string ca_file;    // PEM bundle of trusted CAs; empty: the system's trust store
  std::string cert_file;  // client certificate chain (PEM); empty: none
  std::string key_file;   // its private key (PEM); set with cert_file
};

// Opaque: holds the OpenSSL client context (TLS 1.2 or later, the peer's
// certificate always verified). Thread-safe to share; immutable once made.
class UpstreamTls {
 public:
  struct Impl;
  explicit UpstreamTls(std::unique_ptr<Impl> impl);
  ~UpstreamTls();
  UpstreamTls(const UpstreamTls&) = delete;
  UpstreamTls& operator=(const UpstreamTls&) = delete;

  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Reads the CA bundle (or the system's default paths) and the client
// certificate and key. InvalidArgument naming the file and OpenSSL's reason
// when one cannot be read or the key does not match the certificate.
StatusOr<std::shared_ptr<const UpstreamTls>> MakeUpstreamTls(const UpstreamTlsOptions& options);

}  // namespace idemgate::http
