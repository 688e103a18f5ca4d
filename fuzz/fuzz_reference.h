#pragma once

// The fuzz targets' own encodings (hex, base64, base64url, JSON strings),
// MACs and signatures, and the rule for a caller's components: written here,
// with OpenSSL's primitives only, so that the targets check src/ against an
// independent implementation rather than echo it. Nothing here calls src/.

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "../tests/fakes/test_keys.h"
#include "fuzz_target.h"

namespace idemgate::fuzz {

// ---------------------------------------------------------------------------
// Encodings

inline constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
inline constexpr char kBase64UrlAlphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

inline std::string Hex(std::string_view bytes, bool upper) {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(digits[u >> 4]);
    out.push_back(digits[u & 0xf]);
  }
  return out;
}

// `bytes` in the 64 characters of `alphabet`, '='-padded to a multiple of four when `pad`.
inline std::string EncodeBase64(std::string_view bytes, const char* alphabet, bool pad) {
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (const char c : bytes) {
    bits = (bits << 8 | static_cast<unsigned char>(c)) & 0xffffu;
    count += 8;
    while (count >= 6) {
      count -= 6;
      out.push_back(alphabet[(bits >> count) & 0x3f]);
    }
  }
  if (count > 0) out.push_back(alphabet[(bits << (6 - count)) & 0x3f]);
  while (pad && out.size() % 4 != 0) out.push_back('=');
  return out;
}

// Text in the 64 characters of `alphabet` read back, left-over bits dropped, '=' skipped when
// `skip_padding`; nothing on another character.
inline std::optional<std::string> DecodeBase64(std::string_view text, std::string_view alphabet,
                                               bool skip_padding) {
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (const char c : text) {
    if (skip_padding && c == '=') continue;
    const std::size_t value = alphabet.find(c);
    if (value == std::string_view::npos) return std::nullopt;
    bits = (bits << 6 | static_cast<std::uint32_t>(value)) & 0xffffu;
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xffu));
    }
  }
  return out;
}

// Standard base64, padded.
inline std::string Base64(std::string_view bytes) {
  return EncodeBase64(bytes, kBase64Alphabet, true);
}

// Standard base64 read back with '=' ignored and left-over bits dropped: every spelling of
// the same bytes (src/ may refuse some of them; it must accept none that spells others).
inline std::optional<std::string> LenientBase64Decode(std::string_view text) {
  return DecodeBase64(text, kBase64Alphabet, true);
}

// Unpadded base64url (JOSE).
inline std::string Base64Url(std::string_view bytes) {
  return EncodeBase64(bytes, kBase64UrlAlphabet, false);
}

// Unpadded base64url read back; nothing on another character (a '=' too).
inline std::optional<std::string> Base64UrlDecode(std::string_view text) {
  return DecodeBase64(text, kBase64UrlAlphabet, false);
}

// A JSON string literal of arbitrary bytes, and (when `decoded` is given) appended to it the
// string the literal decodes to: bytes below 0x20, '"' and '\' as \u00XX, and DEL too unless
// `raw_del`; other ASCII as itself; bytes from 0x80 as U+0080..U+00FF, written raw in UTF-8.
inline std::string JsonString(std::string_view s, std::string* decoded = nullptr,
                              bool raw_del = false) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const char utf8[2] = {static_cast<char>(0xc0 | (u >> 6)),
                            static_cast<char>(0x80 | (u & 0x3f))};
      out.append(utf8, 2);
      if (decoded != nullptr) decoded->append(utf8, 2);
      continue;
    }
    if (u < 0x20 || c == '"' || c == '\\' || (u == 0x7f && !raw_del)) {
      out.append("\\u00").append(Hex(std::string_view(&c, 1), false));
    } else {
      out.push_back(c);
    }
    if (decoded != nullptr) decoded->push_back(c);
  }
  return out + "\"";
}

// ---------------------------------------------------------------------------
// MACs and signatures

inline std::string Hmac(const EVP_MD* md, std::string_view key, std::string_view data) {
  static constexpr unsigned char kNothing = 0;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  const auto* k = key.empty() ? &kNothing : reinterpret_cast<const unsigned char*>(key.data());
  const auto* d = data.empty() ? &kNothing : reinterpret_cast<const unsigned char*>(data.data());
  FUZZ_CHECK(HMAC(md, k, static_cast<int>(key.size()), d, data.size(), out, &size) != nullptr);
  return std::string(reinterpret_cast<const char*>(out), size);
}

inline testing::PkeyPtr PrivateKey(const char* pem) {
  testing::PkeyPtr key = testing::ReadPrivateKey(pem);
  FUZZ_CHECK(key != nullptr);
  return key;
}

// PKCS #1 v1.5 (RSA) or DER ECDSA over SHA-256.
inline std::string DigestSign(EVP_PKEY* key, std::string_view input) {
  const std::string signature = testing::DigestSign(key, input);
  FUZZ_CHECK(!signature.empty());
  return signature;
}

// ES256's JOSE form: r || s, 32 bytes each.
inline std::string Es256Sign(EVP_PKEY* key, std::string_view input) {
  const std::string raw = testing::JoseFromDer(DigestSign(key, input));
  FUZZ_CHECK(raw.size() == 64);
  return raw;
}

// ---------------------------------------------------------------------------
// Callers

// A caller's tenant, project or subject: 1..256 visible ASCII characters.
inline bool IsCallerComponent(std::string_view s) {
  if (s.empty() || s.size() > 256) return false;
  for (const char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return false;
  }
  return true;
}

}  // namespace idemgate::fuzz
