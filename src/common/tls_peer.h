#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <string>

// The name a TLS client session must find in the server's certificate, set
// the same way by every client in the project (https upstreams, the client
// library, the JWKS fetch, the tests' client).
namespace idemgate {

// An IP address (v4 or v6) is matched against the certificate's IP entries
// and never sent as SNI (RFC 6066 §3); anything else is a DNS name, sent as
// SNI and matched against the certificate's names, partial wildcards
// ("f*o.example") refused. OpenSSL checks it during the handshake. False
// when OpenSSL refuses the name.
inline bool SetTlsPeerName(SSL* ssl, const std::string& name) {
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str()) == 1) return true;
  ERR_clear_error();  // not an address: a name
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set_tlsext_host_name(ssl, name.c_str()) == 1 && SSL_set1_host(ssl, name.c_str()) == 1) return true;
  ERR_clear_error();
  return false;
}

// After a failed handshake: " (the certificate check's reason)" when the
// certificate was what failed, else "".
inline std::string TlsVerifyVerdict(const SSL* ssl) {
  const long verify = SSL_get_verify_result(ssl);
  if (verify == X509_V_OK) return "";
  return std::string(" (") + X509_verify_cert_error_string(verify) + ")";
}

}  // namespace idemgate
