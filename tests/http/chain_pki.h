#pragma once

// A throw-away PKI with an intermediate CA, for the tests of CA files that
// hold only the intermediate (tests/http/tls_test.cc, tests/client/tls_test.cc,
// tests/integration/tls_listener_test.cc). Header-only; MakeTestPki
// (fakes/testing.h) has no intermediate.

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace idemgate::testing {

// PEM files written into `dir` (created when missing):
//   root.pem                   a self-signed root CA ("idemgate chain root")
//   intermediate.pem           a CA certificate signed by the root
//   server.pem, server.key     a server certificate (CN and DNS localhost, IP 127.0.0.1)
//                              signed by the intermediate, then the intermediate
//   server-rsa.pem, .key       the same with an RSA 2048 key (for RSA cipher suites)
//   client.pem, client.key     a client certificate signed by the intermediate, then
//                              the intermediate
//   client-leaf.pem            the client certificate alone (key client.key)
// Keys are EC P-256 but for server-rsa.key (unencrypted PKCS#8); certificates valid from an hour ago
// for 30 days. Every call makes new keys.
struct ChainPki {
  std::string root;          // dir/root.pem
  std::string intermediate;  // dir/intermediate.pem
  std::string server_cert;   // dir/server.pem
  std::string server_key;    // dir/server.key
  std::string server_rsa_cert;  // dir/server-rsa.pem
  std::string server_rsa_key;   // dir/server-rsa.key
  std::string client_cert;   // dir/client.pem
  std::string client_key;    // dir/client.key
  std::string client_leaf;   // dir/client-leaf.pem
};

namespace chain_pki_internal {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Cert = std::unique_ptr<X509, X509Free>;

inline Status Failed(const std::string& step) {
  char text[256] = "unknown error";
  if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, text, sizeof text);
  ERR_clear_error();
  return InternalError("MakeChainPki: " + step + ": " + text);
}

inline Pkey NewKey() { return Pkey(EVP_EC_gen("P-256")); }

// A certificate for `key` named `cn`, signed by `issuer_key` as `issuer`
// (both null: self-signed); `extensions` as (NID, openssl.cnf value).
inline Cert Issue(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                  const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  if (!cert || X509_set_version(cert.get(), X509_VERSION_3) != 1) return nullptr;
  std::uint64_t serial = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) != 1) return nullptr;
  if (ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), (serial >> 1) | 1) != 1) return nullptr;
  std::time_t now = std::time(nullptr);
  if (X509_time_adj_ex(X509_getm_notBefore(cert.get()), 0, -3600, &now) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), 30, 0, &now) == nullptr) {
    return nullptr;
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("idemgate tests"),
                                 -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1,
                                 -1, 0) != 1) {
    return nullptr;
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1 || X509_set_pubkey(cert.get(), key) != 1) {
    return nullptr;
  }
  std::vector<std::pair<int, std::string>> all = {{NID_subject_key_identifier, "hash"},
                                                  {NID_authority_key_identifier, "keyid:always"}};
  all.insert(all.end(), extensions.begin(), extensions.end());
  for (const auto& [nid, value] : all) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    const bool added = ext != nullptr && X509_add_ext(cert.get(), ext, -1) == 1;
    X509_EXTENSION_free(ext);
    if (!added) return nullptr;
  }
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) <= 0) return nullptr;
  return cert;
}

// Writes the certificates in order, or the key, to `path`.
inline bool Write(const std::string& path, const std::vector<X509*>& certs, EVP_PKEY* key) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  bool ok = true;
  for (X509* c : certs) ok = ok && PEM_write_X509(f, c) == 1;
  if (key != nullptr) ok = ok && PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  return std::fclose(f) == 0 && ok;
}

}  // namespace chain_pki_internal

inline StatusOr<ChainPki> MakeChainPki(const std::string& dir) {
  using namespace chain_pki_internal;
  std::error_code fs_error;
  std::filesystem::create_directories(dir, fs_error);
  if (fs_error) return InternalError("MakeChainPki: creating " + dir + ": " + fs_error.message());
  ChainPki pki{.root = dir + "/root.pem",
               .intermediate = dir + "/intermediate.pem",
               .server_cert = dir + "/server.pem",
               .server_key = dir + "/server.key",
               .server_rsa_cert = dir + "/server-rsa.pem",
               .server_rsa_key = dir + "/server-rsa.key",
               .client_cert = dir + "/client.pem",
               .client_key = dir + "/client.key",
               .client_leaf = dir + "/client-leaf.pem"};
  const std::vector<std::pair<int, std::string>> ca = {{NID_basic_constraints, "critical,CA:TRUE"},
                                                       {NID_key_usage, "critical,keyCertSign,cRLSign"}};
  Pkey root_key = NewKey(), inter_key = NewKey(), server_key = NewKey(), client_key = NewKey();
  Pkey rsa_key(EVP_RSA_gen(2048));
  if (!root_key || !inter_key || !server_key || !client_key || !rsa_key) return Failed("generating the keys");
  Cert root = Issue("idemgate chain root", root_key.get(), nullptr, nullptr, ca);
  if (!root) return Failed("issuing the root");
  Cert inter = Issue("idemgate chain intermediate", inter_key.get(), root.get(), root_key.get(), ca);
  if (!inter) return Failed("issuing the intermediate");
  const std::vector<std::pair<int, std::string>> server_ext = {{NID_basic_constraints, "critical,CA:FALSE"},
                                                               {NID_key_usage, "critical,digitalSignature"},
                                                               {NID_ext_key_usage, "serverAuth"},
                                                               {NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"}};
  Cert server = Issue("localhost", server_key.get(), inter.get(), inter_key.get(), server_ext);
  if (!server) return Failed("issuing the server certificate");
  // RSA key exchange needs keyEncipherment.
  auto rsa_ext = server_ext;
  rsa_ext[1].second = "critical,digitalSignature,keyEncipherment";
  Cert server_rsa = Issue("localhost", rsa_key.get(), inter.get(), inter_key.get(), rsa_ext);
  if (!server_rsa) return Failed("issuing the RSA server certificate");
  Cert client = Issue("idemgate chain client", client_key.get(), inter.get(), inter_key.get(),
                      {{NID_basic_constraints, "critical,CA:FALSE"},
                       {NID_key_usage, "critical,digitalSignature"},
                       {NID_ext_key_usage, "clientAuth"}});
  if (!client) return Failed("issuing the client certificate");
  if (!Write(pki.root, {root.get()}, nullptr) || !Write(pki.intermediate, {inter.get()}, nullptr) ||
      !Write(pki.server_cert, {server.get(), inter.get()}, nullptr) ||
      !Write(pki.server_key, {}, server_key.get()) || !Write(pki.server_rsa_cert, {server_rsa.get(), inter.get()}, nullptr) ||
      !Write(pki.server_rsa_key, {}, rsa_key.get()) || !Write(pki.client_cert, {client.get(), inter.get()}, nullptr) ||
      !Write(pki.client_leaf, {client.get()}, nullptr) || !Write(pki.client_key, {}, client_key.get())) {
    return Failed("writing the files in " + dir);
  }
  return pki;
}

}  // namespace idemgate::testing
