#include "http/upstream_tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl/context.hpp>

#include "http/internal/upstream_tls_impl.h"

namespace idemgate::http {

namespace {

// OpenSSL's queued errors as one line (and the queue emptied), or `fallback`.
std::string OpenSslErrors(std::string fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? fallback : out;
}

}  // namespace

UpstreamTls::UpstreamTls(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UpstreamTls::~UpstreamTls() = default;

StatusOr<std::shared_ptr<const UpstreamTls>> MakeUpstreamTls(const UpstreamTlsOptions& options) {
  ERR_clear_error();
  auto impl = std::make_unique<UpstreamTls::Impl>();
  SSL_CTX* ctx = impl->context.native_handle();
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    return InternalError("TLS: cannot require TLS 1.2: " + OpenSslErrors("unknown error"));
  }
  // No renegotiation, no compression; the peer is always verified.
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (options.ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return InvalidArgumentError("TLS: cannot load the system's trust store: " + OpenSslErrors("unknown error"));
    }
  } else if (SSL_CTX_load_verify_file(ctx, options.ca_file.c_str()) != 1) {
    return InvalidArgumentError("TLS: cannot read CA file \"" + options.ca_file +
                                "\": " + OpenSslErrors("no certificate in it"));
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return InvalidArgumentError("TLS: cert_file and key_file go together");
  }
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
      return InvalidArgumentError("TLS: cannot read client certificate \"" + options.cert_file +
                                  "\": " + OpenSslErrors("no certificate in it"));
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return InvalidArgumentError("TLS: cannot read client key \"" + options.key_file +
                                  "\": " + OpenSslErrors("no key in it"));
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      return InvalidArgumentError("TLS: client key \"" + options.key_file + "\" does not match certificate \"" +
                                  options.cert_file + "\": " + OpenSslErrors("mismatch"));
    }
  }
  return std::shared_ptr<const UpstreamTls>(std::make_shared<UpstreamTls>(std::move(impl)));
}

}  // namespace idemgate::http
