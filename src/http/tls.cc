#include "http/tls.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <openssl/asn1.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/ssl/context.hpp>

#include "common/log.h"
#include "common/secrets.h"
#include "http/internal/tls_impl.h"

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

// ALPN's name for the one protocol served (RFC 7301 wire form).
constexpr unsigned char kHttp11Alpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

// A listener picks http/1.1 when the client offers it (curl and browsers
// offer h2 first); a client that offers only other protocols gets no ALPN
// answer rather than a failed handshake.
int SelectHttp11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
                 void*) {
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kHttp11Alpn, sizeof kHttp11Alpn, in, inlen) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

// TLS 1.2 or later, no renegotiation, no compression.
Status ApplyBaseline(SSL_CTX* ctx) {
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
    return InternalError("TLS: cannot require TLS 1.2: " + OpenSslErrors("unknown error"));
  }
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  return Status::Ok();
}

// Trusts every certificate of a CA file given in the config as an anchor
// (X509_V_FLAG_PARTIAL_CHAIN): a file holding only an intermediate CA
// accepts the certificates it signed, without its issuers in the file. By
// default OpenSSL needs the chain to end at a self-signed root in the file.
void TrustPartialChains(SSL_CTX* ctx) {
  X509_STORE_set_flags(SSL_CTX_get_cert_store(ctx), X509_V_FLAG_PARTIAL_CHAIN);
}

// True when `file` holds a PEM private key under a passphrase (PKCS#8
// "ENCRYPTED PRIVATE KEY", or a traditional key with "Proc-Type: 4,ENCRYPTED").
bool IsEncryptedPem(const std::string& file) {
  StatusOr<std::string> text = ReadWholeFile(file);
  return text.ok() && (text->find("-----BEGIN ENCRYPTED PRIVATE KEY-----") != std::string::npos ||
                       text->find("Proc-Type: 4,ENCRYPTED") != std::string::npos);
}

// `TLS: cannot read listener certificate "FILE": No such file or directory`:
// said before OpenSSL is handed the file, whose error stack names the cause
// only in its own terms.
Status CheckReadable(const std::string& file, const std::string& what) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return InvalidArgumentError("TLS: cannot read " + what + " \"" + file + "\": " + std::strerror(errno));
  }
  ::close(fd);
  return Status::Ok();
}

// Loads a certificate chain and its key; `what` names them in errors
// ("client" or "listener").
Status LoadCertificate(SSL_CTX* ctx, const std::string& cert_file, const std::string& key_file,
                       const std::string& what) {
  if (cert_file.empty() || key_file.empty()) {
    return InvalidArgumentError("TLS: cert_file and key_file go together");
  }
  // Never ask for a passphrase: OpenSSL's default would prompt on the
  // controlling terminal and block the start (or a reload, and with it the
  // signal loop). An encrypted key fails to load instead.
  SSL_CTX_set_default_passwd_cb(ctx, [](char*, int, int, void*) { return 0; });
  if (Status s = CheckReadable(cert_file, what + " certificate"); !s.ok()) return s;
  if (Status s = CheckReadable(key_file, what + " key"); !s.ok()) return s;
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return InvalidArgumentError("TLS: cannot read " + what + " certificate \"" + cert_file +
                                "\": " + OpenSslErrors("no certificate in it"));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    // OpenSSL compares the key with the certificate already loaded here.
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    if (!mismatch && IsEncryptedPem(key_file)) {
      ERR_clear_error();
      return InvalidArgumentError("TLS: " + what + " key \"" + key_file +
                                  "\" is encrypted; a passphrase-protected key is not supported (write it "
                                  "unencrypted, e.g. `openssl pkey -in KEY -out KEY.plain`, readable only by the "
                                  "gateway's user)");
    }
    return InvalidArgumentError(
        "TLS: " +
        (mismatch ? what + " key \"" + key_file + "\" does not match certificate \"" + cert_file + "\""
                  : "cannot read " + what + " key \"" + key_file + "\"") +
        ": " + OpenSslErrors("no key in it"));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgumentError("TLS: " + what + " key \"" + key_file + "\" does not match certificate \"" +
                                cert_file + "\": " + OpenSslErrors("mismatch"));
  }
  return Status::Ok();
}

}  // namespace

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

StatusOr<std::shared_ptr<const TlsContext>> MakeUpstreamTls(const UpstreamTlsOptions& options) {
  ERR_clear_error();
  auto impl = std::make_unique<TlsContext::Impl>(boost::asio::ssl::context::tls_client);
  SSL_CTX* ctx = impl->context.native_handle();
  if (Status s = ApplyBaseline(ctx); !s.ok()) return s;
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Offer http/1.1 (the only protocol the proxy speaks) for upstreams that
  // insist on ALPN. (0 is success here.)
  if (SSL_CTX_set_alpn_protos(ctx, kHttp11Alpn, sizeof kHttp11Alpn) != 0) {
    return InternalError("TLS: cannot set ALPN: " + OpenSslErrors("unknown error"));
  }
  if (options.ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return InvalidArgumentError("TLS: cannot load the system's trust store: " + OpenSslErrors("unknown error"));
    }
  } else if (Status s = CheckReadable(options.ca_file, "CA file"); !s.ok()) {
    return s;
  } else if (SSL_CTX_load_verify_file(ctx, options.ca_file.c_str()) != 1) {
    return InvalidArgumentError("TLS: cannot read CA file \"" + options.ca_file +
                                "\": " + OpenSslErrors("no certificate in it"));
  } else {
    TrustPartialChains(ctx);
  }
  if (!options.cert_file.empty() || !options.key_file.empty()) {
    if (Status s = LoadCertificate(ctx, options.cert_file, options.key_file, "client"); !s.ok()) return s;
  }
  return std::shared_ptr<const TlsContext>(std::make_shared<TlsContext>(std::move(impl)));
}

namespace {

// A listener's TLS 1.2 cipher suites, in the server's order of preference.
constexpr char kServerTls12Ciphers[] =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

// "2026-01-02T03:04:05Z", or "" when `t` cannot be read.
std::string FormatAsn1Time(const ASN1_TIME* t) {
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return "";
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A certificate outside its validity is served (the operator may have a
// reason), but every client that verifies it will refuse the handshake:
// said at start and on every reload, when the files are read.
void WarnIfOutsideValidity(SSL_CTX* ctx, const std::string& cert_file) {
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (cert == nullptr) return;
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    LogWarn("TLS: the listener certificate has expired; clients that verify it refuse every connection",
            {{"cert_file", cert_file}, {"not_after", FormatAsn1Time(X509_get0_notAfter(cert))}});
  } else if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    LogWarn("TLS: the listener certificate is not valid yet; clients that verify it refuse every connection",
            {{"cert_file", cert_file}, {"not_before", FormatAsn1Time(X509_get0_notBefore(cert))}});
  }
}

}  // namespace

StatusOr<std::shared_ptr<const TlsContext>> MakeServerTls(const ServerTlsOptions& options) {
  ERR_clear_error();
  auto impl = std::make_unique<TlsContext::Impl>(boost::asio::ssl::context::tls_server);
  SSL_CTX* ctx = impl->context.native_handle();
  if (Status s = ApplyBaseline(ctx); !s.ok()) return s;
  // TLS 1.2 suites: only ECDHE key exchange (forward secrecy) with AEAD
  // ciphers, Mozilla's "intermediate" list without its DHE suites. OpenSSL's
  // default list also has RSA key exchange and CBC with SHA-1. The TLS 1.3
  // suites (all AEAD, all forward secret) stay OpenSSL's.
  if (SSL_CTX_set_cipher_list(ctx, kServerTls12Ciphers) != 1) {
    return InternalError("TLS: cannot set the TLS 1.2 cipher suites: " + OpenSslErrors("unknown error"));
  }
  // The server's cipher preference decides (TLS 1.2).
  SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_alpn_select_cb(ctx, &SelectHttp11, nullptr);
  if (Status s = LoadCertificate(ctx, options.cert_file, options.key_file, "listener"); !s.ok()) return s;
  WarnIfOutsideValidity(ctx, options.cert_file);
  if (!options.client_ca_file.empty()) {
    if (Status s = CheckReadable(options.client_ca_file, "client CA file"); !s.ok()) return s;
    if (SSL_CTX_load_verify_file(ctx, options.client_ca_file.c_str()) != 1) {
      return InvalidArgumentError("TLS: cannot read client CA file \"" + options.client_ca_file +
                                  "\": " + OpenSslErrors("no certificate in it"));
    }
    TrustPartialChains(ctx);
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options.client_ca_file.c_str());
    if (names != nullptr) SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // With client certificates OpenSSL resumes a session (a ticket or an id
    // from an earlier handshake) only under a session id context, and
    // without one it aborts the handshake: every client that caches sessions
    // (libcurl, Java, nginx's proxy_ssl_session_reuse) would fail from its
    // second connection on. A context made by a reload has new ticket keys
    // and an empty cache, so sessions verified under an older CA list are
    // not resumed.
    static constexpr unsigned char kSessionContext[] = "idemgate-listener";
    if (SSL_CTX_set_session_id_context(ctx, kSessionContext, sizeof kSessionContext - 1) != 1) {
      return InternalError("TLS: cannot set the session id context: " + OpenSslErrors("unknown error"));
    }
  }
  return std::shared_ptr<const TlsContext>(std::make_shared<TlsContext>(std::move(impl)));
}

}  // namespace idemgate::http
