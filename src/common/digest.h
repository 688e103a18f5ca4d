#pragma once

#include <openssl/evp.h>

#include <string>
#include <string_view>

#include "common/hex.h"

// Hex digests with OpenSSL (header-only: the users link OpenSSL::Crypto).
namespace idemgate {

// The lower-case hex of `md` over `data`; "" if OpenSSL fails.
inline std::string DigestHex(const EVP_MD* md, std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &size, md, nullptr) != 1) return {};
  return ToHex(std::string_view(reinterpret_cast<const char*>(digest), size));
}

inline std::string Sha256Hex(std::string_view data) { return DigestHex(EVP_sha256(), data); }
inline std::string Sha1Hex(std::string_view data) { return DigestHex(EVP_sha1(), data); }

}  // namespace idemgate
