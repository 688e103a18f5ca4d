#pragma once

// The RSA and EC keys of the JWT and JWKS tests (tests/identity/jwt_test.cc) and
// fuzz targets (fuzz/jwt_fuzz.cc, fuzz/jwks_fuzz.cc), owners for the OpenSSL
// objects made from them, and signing with them. Header-only, and nothing here
// calls src/: the fuzz targets, which do not link idemgate_testing, include it too.
//
// The keys were generated with
//   openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048
//     (A, B; 1024 bits for the short one)
//   openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256
//     (A, B; P-384 for the wrong curve)
//   openssl pkey -pubout

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace idemgate::testing {

// ---------------------------------------------------------------------------
// Keys

inline constexpr char kRsaAPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCySZjRcFnXWKr1
tCDVU9/ZhYNvTAcpLZuMzlzLx+gdtpW3VdqRNmd+pH2Y8ieTj+cCP6JkOdJvYdYU
QOhRt8cHF7m9LwRdjFygxO+vDuJ9aMyr/RV57fojPAjj3K8t7ogTjsgFvfbCAN2g
ur8pdE1lBoAV4mKyQ+iatONrYUgqw5Rpg9VJUiOCt4/FRgZ7hHaaRy/LFNVjpIS7
mzUQEhQKxDFOj0AW4cBhp93zmbNlDbSUnb/3rvyJiXf7gt4Zluyf+9wkPlXATPfd
BchksyERxeeWb425RHY5Wbft6wH9cUUACmNTc3Cbgv8SQ5VAtWMski9uqPX02m8a
CDZ6DmpfAgMBAAECggEAOYm7+neuXuvcPLCV2hMYDqzilqQsOXNhHIeq9g89j31S
Axl/kNbEfuAaMqaP9DUAYj7kK0Fn8w9Zli6+a0UKw/S5ul72ozQ93prAGbiNitis
GSNz72ZIkF97JQKfPI0bOGifkA7XGJRL8mficr/4jE6VPrrRjGOTKX6QWKLMNhRf
gHlSN4/PyeDRYTOQFcTzp3MoJRkWTtg/cl/2hA2/ysyaNfj2B27HvagpE/Hc0NL3
epe84opSliV/VLl30rWIQ76Avw/PvkVOOzSsxqsFklryiBqlrKrLzs2Emvt5mCDP
b37JNu7Dfs4Wq23ognuGrgvRM5ek1Iw6bwimkclwkQKBgQDf68fSjaqSfeH6531s
qFHTPxLofUNvEqpQY8tWys5nCy/GsfCJGjpQxtCFml7/PFDzLlAw3axCFEu1eTvW
W2t55y8WYiPDRZgVgs6MuLfvXY09AOwsudZwUCT2BfJYlK8dIbSmyg+iIpDZkngV
zInBY0XWI55MBxf6Q5bvheUJsQKBgQDL1DlJvbGViY52gP9AdxT3fAUMck1GxlpG
OYw1rvswOfgs4DSEQWMsw0NG/ZMTdKLsJKr4RgwuCXHDhd5f7z79a9dTumlCyxxw
Cd9P0gN7eL/as6lTp9j3Rr7vTRpk2KuyTR4hH0IwdRb/IVF7GpQDOf8CTgC9Wlj3
bwuaxE2pDwKBgEyqByIZirrZCpPCyfh3sHwo7ipXKM1QkKsxX575lK1G8TaQGZB3
QFwDlcUIU1oDppt70czJOH7vP/SD6266ohN8iWyacTAcFbPXsywO2jrDxuWJ+VJe
1gJiDiWFZ7HYRhQtRBKOv8d9GibDtQWRn+BsQq7MRxg0nYr7tSOQrhghAoGBAMmY
jky73I9NLOVSMqNc5BTeydOEnZ+5gQHh2yYhefk57Jbd7bM9RMy6F6l4FWZxvs4W
ei7ygQtrdeRvXADAjSly5ta+EWvpnafGa+LzkVQmmoLBnWDLKxFvHFtshAVoM3E3
SuxxkTKCLIuMNZ2vLOOAEhMCeULOwB2B7BVXwIPLAoGASquHqS22vXJNJLe8xw1h
rwARTKaOJw/QyGnqHmlazDgDeJpoVIwgTfwMbpkgi7LCGWj9UTRoCxMdQa5S6PP2
20ubWeB3NHj8w33TyP3cZ1KeR4jcxFJqhzfedS6M/zsODdlzvqikN7vPRYSUYDGW
06Ii9E6gLIhHCkaycGyPnfk=
-----END PRIVATE KEY-----
)pem";
inline constexpr char kRsaAPublic[] = R"pem(-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAskmY0XBZ11iq9bQg1VPf
2YWDb0wHKS2bjM5cy8foHbaVt1XakTZnfqR9mPInk4/nAj+iZDnSb2HWFEDoUbfH
Bxe5vS8EXYxcoMTvrw7ifWjMq/0Vee36IzwI49yvLe6IE47IBb32wgDdoLq/KXRN
ZQaAFeJiskPomrTja2FIKsOUaYPVSVIjgrePxUYGe4R2mkcvyxTVY6SEu5s1EBIU
CsQxTo9AFuHAYafd85mzZQ20lJ2/9678iYl3+4LeGZbsn/vcJD5VwEz33QXIZLMh
EcXnlm+NuUR2OVm37esB/XFFAApjU3Nwm4L/EkOVQLVjLJIvbqj19NpvGgg2eg5q
XwIDAQAB
-----END PUBLIC KEY-----
)pem";
inline constexpr char kRsaBPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQCd+VmWMTtViEwk
DSQP1uvmzF4z5Efq0tLPvd0crXu8o5GQjZIlcjY6C7X3O39rbNELPmwD6ths7imV
iZ+wM79fD0jZjOICDQe6uI1rHI6B3YHlozBf0JFDOZu4V3JZAXOUUN+fXmW875A1
y2zAiNadCi7cTlCUH2lDmYbGWUYCnOWtTyzt6D0W1dFcBSSgWfrK4myxOMi++LPr
uY7BaxqH7F5EYyRd5/4KQIdUKl1PRaQslF/WLDArTQ1NDReO9GR7ZxXqGA0hMhxX
wbk32SU9AjX6A7K/sO+mqAHMe7s+31KJ1t+7gvCzGDKWcGvd4UuX95aKhsIZ0iRr
+Sx3Jme7AgMBAAECggEAJaJqylIuPYE8Cnaq+a8NAi3730bqLzJMkLs9uwBFczpQ
imx/vbYI3yk9D4o4H+KLpq8XUpOXPdQ7SenAhly9oarlgxaCHVT3W29uGW9zL9MS
iB+pfZoVkTtfMrp6fmPPIi1mKPR3LlywMXCmFvRClKUBZvCtV6xoCne/2O8Zs7NH
SfD/f1rEcY6l6l5xMrvEwfYA8eowbyrphvkAx2zaETHGYR4mt+t8H3ZyrK12ph86
uoC11OAOYxmezUibg5T3je1MLIC35riRkbySxtJm+wM8L/+kXLRv8ciGMNq/XBlJ
cLeUcW1VV3GoFU3vVqHZiNaHrndP4rmVnwHp9qwNWQKBgQDRkNiJAzPGzu7mF2oe
ZvGo7ypYyNdpkhs13pJtZBESkCDVvEJBkSB5AqZBNLNF9p4ISvqkS/4cCl3IHDNk
1hd0VtVv66vFVXWN1TbDeqprWt8R1tlVjz+eBP6s6Wi7gDYdiPKN3jjB/GhMfGMW
M6FcNviwrrj6a59tXBrwCzL43wKBgQDA+hM4dtNsD3rXYO7ZzZFR0EMB9G39znKs
cHEh2XrdjJjCk9OxhukAM6aie5yeHd/7m+QzTqmGNq0pK63CMojFqThE2OjKIApF
kqiH7K42fZsxmFrPXpHOZ+vekB/3FwL4NHFDI+F6RdRSy6B7xx792IaanV2fHVv6
yV7RjjQApQKBgBhPBu8NsgnTox6JhMO2CT4hT/Ywhdw3GHTtNmr9+oT+tvBUABN+
9BdVWVei91CcRMSNfflk3zr9cNdvff6qXtod4HA1FB21xgcHvmx6ZB5D0jBNjbRB
A44e4jPId1+Yha5zXj9akZbe4nJM02mV35fEwKAuBEL4DOwwjOdfRTBdAoGAW1rH
mJZgFirp22YvDHrNja6K2jUNkPaXwNxmIkEjchhqBMsYj1UvnoHVI9xi01OPQjyV
dliJ1lix9uiPlHx51SD721PYOD+cvTzlfZtlCbTCsGLQspSxb8YwmiceismhBUFG
USN+TXUbQ6rUKWSlXkSPzEgtFvM+JOYJdijco2UCgYBjIFBv4QPMdgLu/acd0ZXm
u76luumUExG2E7Jw/Lg0oLrtYVYhzTmZO4wHYndT1RVOe0HJp/d+NVthRactB4C0
tPBMJlM0Anaw4IiJHxHdtL9X1oL2yzv8/6bZL0rLY6N9EEfO+BZyiYAsS/c1LMdq
lZi5Nfm1Udrol5QIKbp/rA==
-----END PRIVATE KEY-----
)pem";
inline constexpr char kRsaBPublic[] = R"pem(-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAnflZljE7VYhMJA0kD9br
5sxeM+RH6tLSz73dHK17vKORkI2SJXI2Ogu19zt/a2zRCz5sA+rYbO4plYmfsDO/
Xw9I2YziAg0HuriNaxyOgd2B5aMwX9CRQzmbuFdyWQFzlFDfn15lvO+QNctswIjW
nQou3E5QlB9pQ5mGxllGApzlrU8s7eg9FtXRXAUkoFn6yuJssTjIvviz67mOwWsa
h+xeRGMkXef+CkCHVCpdT0WkLJRf1iwwK00NTQ0XjvRke2cV6hgNITIcV8G5N9kl
PQI1+gOyv7DvpqgBzHu7Pt9Sidbfu4LwsxgylnBr3eFLl/eWiobCGdIka/ksdyZn
uwIDAQAB
-----END PUBLIC KEY-----
)pem";
inline constexpr char kEcPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgcU2GsTuZ9pMIm9/v
jlZ4yBw7vD3YTqKQJ/WRX7Qt1juhRANCAASOe1qGLxWxrkolVpf7eQXU61t7XMjE
te8YqUWV+qkAcNoDyfuwb9eVoahNTkLn4d/LwmFWV1d/UF5B7P99cHol
-----END PRIVATE KEY-----
)pem";
inline constexpr char kEcPublic[] = R"pem(-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEjntahi8Vsa5KJVaX+3kF1Otbe1zI
xLXvGKlFlfqpAHDaA8n7sG/XlaGoTU5C5+Hfy8JhVldXf1BeQez/fXB6JQ==
-----END PUBLIC KEY-----
)pem";
inline constexpr char kEcBPrivate[] = R"pem(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSX+S2ic6m6xAixlo
M/pHdxIrmzBOqXw682qvk9Zfn6+hRANCAAQgyYDmTeUBYMWNtTQw62lFltAh+lGO
VpA/Ey2c7tBZtXJtjcbIJUEvV41FT1J4sq18wzsDOlCgxIjj22D+g+iS
-----END PRIVATE KEY-----
)pem";
inline constexpr char kEcBPublic[] = R"pem(-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEIMmA5k3lAWDFjbU0MOtpRZbQIfpR
jlaQPxMtnO7QWbVybY3GyCVBL1eNRU9SeLKtfMM7AzpQoMSI49tg/oPokg==
-----END PUBLIC KEY-----
)pem";
inline constexpr char kRsa1024Public[] = R"pem(-----BEGIN PUBLIC KEY-----
MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDTreGEcDVA/ZLaD4Lh9sYnV43j
BKbCexsXAqeN0LoO8MRwMY3B+P6lLdXvUtmrr+wv8MlS2nSRl7Kf5d5njMBdTbEl
uTRjvEntfEWVF727aoJEi42i8avxrlFeyZFDk/JJNiRAnZGe3kkayuVDCmr8rBzZ
/uX9owuQWp4IRg34MwIDAQAB
-----END PUBLIC KEY-----
)pem";
inline constexpr char kEc384Public[] = R"pem(-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAENilrkO4scxl9w67vdvw3aVRtsNK6xPxj
1BQDOPtjnpvJGRNLNxrRDamUtnUYGJsfZvv8EXfIO9n5eCU25j8vM0qFcdfdHhWw
wtcnv3pHJIfBf2vMRr9EukF7Cs8uxmQc
-----END PUBLIC KEY-----
)pem";
// The JWK parameters of kRsaAPublic and kEcPublic as the openssl command line prints them
// (`openssl rsa -pubin -modulus -noout`, `openssl ec -pubin -text -noout`), in base64url.
inline constexpr char kRsaAN[] =
    "skmY0XBZ11iq9bQg1VPf2YWDb0wHKS2bjM5cy8foHbaVt1XakTZnfqR9mPInk4_nAj-iZDnSb2HWFEDoUbfHBx"
    "e5vS8EXYxcoMTvrw7ifWjMq_0Vee36IzwI49yvLe6IE47IBb32wgDdoLq_KXRNZQaAFeJiskPomrTja2FIKsOU"
    "aYPVSVIjgrePxUYGe4R2mkcvyxTVY6SEu5s1EBIUCsQxTo9AFuHAYafd85mzZQ20lJ2_9678iYl3-4LeGZbsn_"
    "vcJD5VwEz33QXIZLMhEcXnlm-NuUR2OVm37esB_XFFAApjU3Nwm4L_EkOVQLVjLJIvbqj19NpvGgg2eg5qXw";
inline constexpr char kEcX[] = "jntahi8Vsa5KJVaX-3kF1Otbe1zIxLXvGKlFlfqpAHA";
inline constexpr char kEcY[] = "2gPJ-7Bv15WhqE1OQufh38vCYVZXV39QXkHs_31weiU";

// ---------------------------------------------------------------------------
// OpenSSL objects

template <auto Free>
struct OpenSslDeleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO_free>>;
using BignumPtr = std::unique_ptr<BIGNUM, OpenSslDeleter<BN_free>>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, OpenSslDeleter<ECDSA_SIG_free>>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, OpenSslDeleter<EVP_MD_CTX_free>>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY_free>>;

// The key of a PEM private key (PKCS #8), or null.
inline PkeyPtr ReadPrivateKey(const char* pem) {
  BioPtr bio(BIO_new_mem_buf(pem, -1));
  return PkeyPtr(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
}

// The key of a PEM public key (SubjectPublicKeyInfo), or null.
inline PkeyPtr ReadPublicKey(const char* pem) {
  BioPtr bio(BIO_new_mem_buf(pem, -1));
  return PkeyPtr(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
}

// EVP_DigestSign with SHA-256: PKCS #1 v1.5 for RSA, DER for ECDSA. Empty when it fails.
inline std::string DigestSign(EVP_PKEY* key, std::string_view input) {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  std::size_t size = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  if (ctx == nullptr || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &size, data, input.size()) != 1) {
    return {};
  }
  std::string signature(size, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size, data,
                     input.size()) != 1) {
    return {};
  }
  signature.resize(size);
  return signature;
}

// A DER ECDSA P-256 signature in its JOSE form (ES256): r || s, each left-padded to 32 bytes.
// Empty when `der` is not one.
inline std::string JoseFromDer(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size())));
  unsigned char raw[64];
  if (sig == nullptr || BN_bn2binpad(ECDSA_SIG_get0_r(sig.get()), raw, 32) != 32 ||
      BN_bn2binpad(ECDSA_SIG_get0_s(sig.get()), raw + 32, 32) != 32) {
    return {};
  }
  return std::string(reinterpret_cast<const char*>(raw), sizeof(raw));
}

}  // namespace idemgate::testing
