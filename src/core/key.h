#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace idemgate::core {

// Validation rules for raw Idempotency-Key values (SPEC §3).
struct KeyRules {
  std::size_t max_length = 255;
  // Characters allowed beyond [A-Za-z0-9._~-]. A colon here is still refused.
  std::string extra_charset;
};

// Why a key was refused. Each value has a distinct metric label
// (KeyErrorReason), used as `idempotency_key_invalid_total{reason}`.
enum class KeyError {
  kNone,
  kMissing,         // no header line at all (a policy matter, not "invalid")
  kDuplicate,       // more than one header line
  kList,            // a comma outside a string: several list members
  kParameters,      // a ";" outside a string: an item with parameters
  kEmpty,           // empty value or ""
  kBadString,       // bad escape, unterminated string, junk after it, non-ASCII in it
  kBadCharset,      // a character outside the allowed set
  kTooLong,         // more than max_length characters
  kReservedPrefix,  // starts with "t-"
  kColon,           // contains ':'
};

// "missing", "duplicate", "list", "parameters", "empty", "bad_string",
// "charset", "too_long", "reserved_prefix", "colon" ("" for kNone).
std::string_view KeyErrorReason(KeyError error);

inline constexpr std::string_view kReservedKeyPrefix = "t-";

struct ParsedKey {
  KeyError error = KeyError::kNone;
  std::string key;          // the raw key (unescaped); set when ok()
  bool sf_string = false;   // it was sent as a Structured Field String
  bool ok() const { return error == KeyError::kNone; }
};

// Parses the Idempotency-Key field from every line the request carried
// (`values`: 0, 1 or more, as received). One line holding either an RFC 8941
// sf-string ("abc", with \" and \\ escapes) or a bare value (abc); both
// spellings give the same key. Leading and trailing spaces and tabs are
// ignored. Pure; thread-safe.
ParsedKey ParseIdempotencyKey(const std::vector<std::string_view>& values, const KeyRules& rules);

// Validates an already unescaped raw key against `rules` (length, charset,
// reserved prefix, colon). Returns kNone when valid.
KeyError ValidateRawKey(std::string_view raw, const KeyRules& rules);

// The key as an sf-string ("abc", escaping " and \), as a client or the
// gateway sends it upstream.
std::string SerializeKeyAsSfString(std::string_view raw);

}  // namespace idemgate::core
