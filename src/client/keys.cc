#include "client/client.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "client/quote.h"
#include "core/key.h"

// Idempotency keys: random UUIDs (v4, v7), the derived UUID v8 of Case C, and
// the gateway's check of a given key.
namespace idemgate::client {

namespace {

using Uuid = std::array<unsigned char, 16>;

// Fills `out` with cryptographically strong bytes: OpenSSL first, the
// system's random device if OpenSSL fails. Without any randomness the
// process aborts: a predictable key could merge two different actions.
void FillRandom(unsigned char* out, std::size_t size) {
  if (RAND_bytes(out, static_cast<int>(size)) == 1) return;
  try {
    std::random_device device;
    for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(device());
    return;
  } catch (...) {
  }
  std::fputs("idemgate client: no source of random bytes for idempotency keys\n", stderr);
  std::abort();
}

// Overwrites the version nibble (byte 6) and the RFC 9562 variant bits 10 (byte 8).
void SetVersionAndVariant(Uuid& bytes, unsigned version) {
  bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | (version << 4));
  bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);
}

// Lower-case 8-4-4-4-12 text.
std::string FormatUuid(const Uuid& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0x0f];
  }
  return out;
}

// Appends `part` framed by its length as 8 bytes, big-endian.
void AppendFramed(std::string& out, std::string_view part) {
  const std::uint64_t size = part.size();
  for (int shift = 56; shift >= 0; shift -= 8) out += static_cast<char>((size >> shift) & 0xff);
  out.append(part);
}

// The key in a message: quoted, and cut short when long.
std::string KeyForMessage(std::string_view key) {
  constexpr std::size_t kShown = 64;
  return key.size() <= kShown ? QuoteInput(key) : QuoteInput(key.substr(0, kShown)) + "...";
}

}  // namespace

// The gateway's own rules (core::ValidateRawKey), explained.
Status ValidateKey(std::string_view key) {
  const core::KeyRules rules;  // the defaults: what a gateway accepts unless a route widens them
  const core::KeyError error = core::ValidateRawKey(key, rules);
  const std::string named = "key " + KeyForMessage(key);
  switch (error) {
    case core::KeyError::kNone:
      return Status::Ok();
    case core::KeyError::kEmpty:
      return InvalidArgumentError("the key is empty");
    case core::KeyError::kTooLong:
      return InvalidArgumentError(named + " is " + std::to_string(key.size()) +
                                  " characters long; the gateway takes at most " +
                                  std::to_string(rules.max_length));
    case core::KeyError::kColon:
      return InvalidArgumentError(named + " contains a colon, which the gateway refuses");
    case core::KeyError::kBadCharset: {
      // The first character the rules refuse on its own.
      std::size_t at = 0;
      while (at < key.size() && core::ValidateRawKey(key.substr(at, 1), rules) != core::KeyError::kBadCharset) ++at;
      std::string why = named + " has a character outside [A-Za-z0-9._~-]";
      if (at < key.size()) why += " (" + QuoteInput(key.substr(at, 1)) + " at offset " + std::to_string(at) + ")";
      return InvalidArgumentError(why + ", which the gateway refuses");
    }
    case core::KeyError::kReservedPrefix:
      return InvalidArgumentError(named + " starts with \"" + std::string(core::kReservedKeyPrefix) +
                                  "\", which is reserved for the gateway's scoped keys");
    default:
      return InvalidArgumentError(named + " is refused by the gateway (" +
                                  std::string(core::KeyErrorReason(error)) + ")");
  }
}

// A UUID v4 from 122 random bits.
std::string NewKeyV4() {
  Uuid bytes;
  FillRandom(bytes.data(), bytes.size());
  SetVersionAndVariant(bytes, 4);
  return FormatUuid(bytes);
}

// A UUID v7: 48-bit big-endian Unix milliseconds (0 before 1970), then random bits.
std::string NewKeyV7(std::chrono::system_clock::time_point now) {
  Uuid bytes;
  FillRandom(bytes.data(), bytes.size());
  std::int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  if (ms < 0) ms = 0;
  const std::uint64_t stamp = static_cast<std::uint64_t>(ms) & 0xffff'ffff'ffffULL;
  for (int i = 0; i < 6; ++i) bytes[i] = static_cast<unsigned char>((stamp >> (8 * (5 - i))) & 0xff);
  SetVersionAndVariant(bytes, 7);
  return FormatUuid(bytes);
}

// A UUID v8 from the first 16 bytes of SHA-256 over the length-prefixed parts.
std::string DerivedKey(std::string_view domain, std::string_view subject, std::string_view entity,
                       std::string_view operation, std::string_view version) {
  std::string framed;
  framed.reserve(5 * 8 + domain.size() + subject.size() + entity.size() + operation.size() + version.size());
  for (std::string_view part : {domain, subject, entity, operation, version}) AppendFramed(framed, part);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int digest_size = 0;
  if (EVP_Digest(framed.data(), framed.size(), digest.data(), &digest_size, EVP_sha256(), nullptr) != 1 ||
      digest_size < 16) {
    // A derived key must be the same everywhere; there is no safe substitute.
    std::fputs("idemgate client: SHA-256 is unavailable for derived keys\n", stderr);
    std::abort();
  }
  Uuid bytes;
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = digest[i];
  SetVersionAndVariant(bytes, 8);
  return FormatUuid(bytes);
}

}  // namespace idemgate::client
