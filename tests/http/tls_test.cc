// The TLS contexts of src/http/tls.cc, each side in a handshake with a plain
// OpenSSL peer over an in-memory BIO pair: the listener's TLS 1.2 cipher
// suites and protocol floor, and CA files (a listener's client_ca_file, an
// upstream's ca_file) that hold only an intermediate CA.
#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "fakes/testing.h"
#include "http/chain_pki.h"
#include "http/internal/tls_impl.h"
#include "http/tls.h"

namespace idemgate::http {
namespace {

using idemgate::testing::ChainPki;
using idemgate::testing::MakeChainPki;
using idemgate::testing::MakeTestPki;
using idemgate::testing::TempDir;
using idemgate::testing::TestPki;

struct CtxFree {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
};
using Ctx = std::unique_ptr<SSL_CTX, CtxFree>;

struct Result {
  bool client_ok = false;  // the client's side of the handshake completed
  bool server_ok = false;  // the server's side did, and it accepted the client
  std::string cipher;      // the suite agreed, when both completed
};

// Runs a handshake between `client` and `server` over a BIO pair until both
// sides are done or neither can move. Under TLS 1.3 the client finishes
// before the server has read its certificate, so both sides are reported.
Result Handshake(SSL_CTX* client, SSL_CTX* server) {
  SSL* c = SSL_new(client);
  SSL* s = SSL_new(server);
  BIO* cb = nullptr;
  BIO* sb = nullptr;
  BIO_new_bio_pair(&cb, 0, &sb, 0);
  SSL_set_bio(c, cb, cb);
  SSL_set_bio(s, sb, sb);
  SSL_set_connect_state(c);
  SSL_set_accept_state(s);
  Result result;
  bool c_failed = false;
  bool s_failed = false;
  for (int round = 0; round < 50 && !(c_failed || s_failed) && !(result.client_ok && result.server_ok); ++round) {
    if (!result.client_ok && !c_failed) {
      const int r = SSL_do_handshake(c);
      if (r == 1) {
        result.client_ok = true;
      } else if (const int e = SSL_get_error(c, r); e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        c_failed = true;
      }
    }
    if (!result.server_ok && !s_failed) {
      const int r = SSL_do_handshake(s);
      if (r == 1) {
        result.server_ok = true;
      } else if (const int e = SSL_get_error(s, r); e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        s_failed = true;
      }
    }
  }
  if (result.client_ok && result.server_ok) result.cipher = SSL_get_cipher_name(c);
  SSL_free(c);
  SSL_free(s);
  ERR_clear_error();
  return result;
}

// A plain OpenSSL client trusting `ca_file` (empty: verifying nothing),
// presenting `cert_file`/`key_file` when set.
Ctx Client(const std::string& ca_file, const std::string& cert_file = "", const std::string& key_file = "") {
  Ctx ctx(SSL_CTX_new(TLS_client_method()));
  if (!ca_file.empty()) {
    EXPECT_EQ(SSL_CTX_load_verify_file(ctx.get(), ca_file.c_str()), 1);
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  }
  if (!cert_file.empty()) {
    EXPECT_EQ(SSL_CTX_use_certificate_chain_file(ctx.get(), cert_file.c_str()), 1);
    EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx.get(), key_file.c_str(), SSL_FILETYPE_PEM), 1);
  }
  return ctx;
}

// A plain OpenSSL server with `cert_file` and `key_file`.
Ctx Server(const std::string& cert_file, const std::string& key_file) {
  Ctx ctx(SSL_CTX_new(TLS_server_method()));
  EXPECT_EQ(SSL_CTX_use_certificate_chain_file(ctx.get(), cert_file.c_str()), 1);
  EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx.get(), key_file.c_str(), SSL_FILETYPE_PEM), 1);
  return ctx;
}

SSL_CTX* Native(const std::shared_ptr<const TlsContext>& context) { return context->impl().context.native_handle(); }

class TlsContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pki = MakeTestPki(dir_.Join("pki"));
    ASSERT_TRUE(pki.ok()) << pki.status().ToString();
    pki_ = *pki;
    auto chain = MakeChainPki(dir_.Join("chain"));
    ASSERT_TRUE(chain.ok()) << chain.status().ToString();
    chain_ = *chain;
  }

  std::shared_ptr<const TlsContext> Listener(const std::string& client_ca_file = "") {
    return Listener(pki_.server_cert, pki_.server_key, client_ca_file);
  }
  static std::shared_ptr<const TlsContext> Listener(const std::string& cert, const std::string& key,
                                                    const std::string& client_ca_file) {
    auto made = MakeServerTls(ServerTlsOptions{.cert_file = cert, .key_file = key, .client_ca_file = client_ca_file});
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return made.ok() ? *made : nullptr;
  }

  TempDir dir_;
  TestPki pki_;
  ChainPki chain_;
};

// Over TLS 1.2 the listener agrees only ECDHE suites with AEAD ciphers:
// RSA key exchange (no forward secrecy) and CBC suites are refused, with an
// RSA certificate (which RSA key exchange needs) or an EC one.
TEST_F(TlsContextTest, TheListenerRefusesTls12SuitesWithoutForwardSecrecyOrAead) {
  struct Case {
    std::shared_ptr<const TlsContext> listener;
    std::string ca_file;
    std::vector<std::string> weak, strong;
  };
  const Case cases[] = {
      {.listener = Listener(chain_.server_rsa_cert, chain_.server_rsa_key, ""),
       .ca_file = chain_.root,
       .weak = {"AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA", "AES256-SHA", "AES128-SHA256",
                "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA384"},
       .strong = {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-CHACHA20-POLY1305"}},
      {.listener = Listener(),
       .ca_file = pki_.ca_file,
       .weak = {"ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"},
       .strong = {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                  "ECDHE-ECDSA-CHACHA20-POLY1305"}},
  };
  for (const Case& c : cases) {
    ASSERT_NE(c.listener, nullptr);
    for (const std::string& weak : c.weak) {
      Ctx client = Client(c.ca_file);
      SSL_CTX_set_max_proto_version(client.get(), TLS1_2_VERSION);
      ASSERT_EQ(SSL_CTX_set_cipher_list(client.get(), weak.c_str()), 1) << weak;
      const Result r = Handshake(client.get(), Native(c.listener));
      EXPECT_FALSE(r.client_ok || r.server_ok) << weak << " was agreed";
    }
    for (const std::string& strong : c.strong) {
      Ctx client = Client(c.ca_file);
      SSL_CTX_set_max_proto_version(client.get(), TLS1_2_VERSION);
      ASSERT_EQ(SSL_CTX_set_cipher_list(client.get(), strong.c_str()), 1) << strong;
      const Result r = Handshake(client.get(), Native(c.listener));
      EXPECT_TRUE(r.client_ok && r.server_ok) << strong;
      EXPECT_EQ(r.cipher, strong);
    }
    // A client offering everything gets an ECDHE suite under TLS 1.2, and
    // TLS 1.3 when it may.
    Ctx any12 = Client(c.ca_file);
    SSL_CTX_set_max_proto_version(any12.get(), TLS1_2_VERSION);
    ASSERT_EQ(SSL_CTX_set_cipher_list(any12.get(), "ALL"), 1);
    const Result r12 = Handshake(any12.get(), Native(c.listener));
    ASSERT_TRUE(r12.client_ok && r12.server_ok);
    EXPECT_EQ(r12.cipher.rfind("ECDHE-", 0), 0u) << r12.cipher;
    Ctx any13 = Client(c.ca_file);
    const Result r13 = Handshake(any13.get(), Native(c.listener));
    ASSERT_TRUE(r13.client_ok && r13.server_ok);
    EXPECT_EQ(r13.cipher.rfind("TLS_", 0), 0u) << r13.cipher;
  }
}

TEST_F(TlsContextTest, TheListenerRefusesTls11) {
  auto listener = Listener();
  ASSERT_NE(listener, nullptr);
  Ctx client = Client(pki_.ca_file);
  SSL_CTX_set_security_level(client.get(), 0);
  SSL_CTX_set_min_proto_version(client.get(), TLS1_VERSION);
  SSL_CTX_set_max_proto_version(client.get(), TLS1_1_VERSION);
  ASSERT_EQ(SSL_CTX_set_cipher_list(client.get(), "ALL:@SECLEVEL=0"), 1);
  const Result r = Handshake(client.get(), Native(listener));
  EXPECT_FALSE(r.client_ok || r.server_ok);
}

// client_ca_file holding only an intermediate CA: certificates it signed are
// accepted (with or without the intermediate sent along), others are not.
TEST_F(TlsContextTest, AListenersClientCaFileMayHoldOnlyAnIntermediate) {
  auto listener = Listener(chain_.intermediate);
  ASSERT_NE(listener, nullptr);
  for (int tls12 = 0; tls12 < 2; ++tls12) {
    for (const std::string& cert : {chain_.client_cert, chain_.client_leaf}) {
      Ctx client = Client(pki_.ca_file, cert, chain_.client_key);
      if (tls12 != 0) SSL_CTX_set_max_proto_version(client.get(), TLS1_2_VERSION);
      const Result r = Handshake(client.get(), Native(listener));
      EXPECT_TRUE(r.client_ok && r.server_ok) << cert << (tls12 != 0 ? " over TLS 1.2" : " over TLS 1.3");
    }
    // A certificate from another CA, and none at all, are still refused.
    Ctx stranger = Client(pki_.ca_file, pki_.client_cert, pki_.client_key);
    if (tls12 != 0) SSL_CTX_set_max_proto_version(stranger.get(), TLS1_2_VERSION);
    EXPECT_FALSE(Handshake(stranger.get(), Native(listener)).server_ok);
    Ctx anonymous = Client(pki_.ca_file);
    if (tls12 != 0) SSL_CTX_set_max_proto_version(anonymous.get(), TLS1_2_VERSION);
    EXPECT_FALSE(Handshake(anonymous.get(), Native(listener)).server_ok);
  }
  // The root alone still works as before.
  auto by_root = Listener(chain_.root);
  ASSERT_NE(by_root, nullptr);
  Ctx client = Client(pki_.ca_file, chain_.client_cert, chain_.client_key);
  const Result r = Handshake(client.get(), Native(by_root));
  EXPECT_TRUE(r.client_ok && r.server_ok);
}

// An upstream's ca_file holding only the intermediate CA that signed the
// upstream's certificate is enough; an unrelated CA is not.
TEST_F(TlsContextTest, AnUpstreamsCaFileMayHoldOnlyAnIntermediate) {
  Ctx upstream = Server(chain_.server_cert, chain_.server_key);
  for (const std::string& ca : {chain_.intermediate, chain_.root}) {
    auto made = MakeUpstreamTls(UpstreamTlsOptions{.ca_file = ca});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    const Result r = Handshake(Native(*made), upstream.get());
    EXPECT_TRUE(r.client_ok && r.server_ok) << ca;
  }
  auto other = MakeUpstreamTls(UpstreamTlsOptions{.ca_file = pki_.ca_file});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(Handshake(Native(*other), upstream.get()).client_ok);
}

// The upstream side keeps OpenSSL's default suites: an upstream that offers
// only a TLS 1.2 suite without forward secrecy is still reached.
TEST_F(TlsContextTest, TheUpstreamSideKeepsOpenSslsDefaultSuites) {
  Ctx upstream = Server(pki_.server_cert, pki_.server_key);
  SSL_CTX_set_max_proto_version(upstream.get(), TLS1_2_VERSION);
  ASSERT_EQ(SSL_CTX_set_cipher_list(upstream.get(), "ECDHE-ECDSA-AES128-SHA"), 1);
  auto made = MakeUpstreamTls(UpstreamTlsOptions{.ca_file = pki_.ca_file});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const Result r = Handshake(Native(*made), upstream.get());
  EXPECT_TRUE(r.client_ok && r.server_ok);
  EXPECT_EQ(r.cipher, "ECDHE-ECDSA-AES128-SHA");
}

}  // namespace
}  // namespace idemgate::http
