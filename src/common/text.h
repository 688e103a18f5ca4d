#pragma once

#include <string>
#include <string_view>

// Text helpers for output that must be valid JSON or plain ASCII whatever
// bytes it shows (the admin API's records, idemctl's dead letters).
namespace idemgate {

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// `bytes` with each ill-formed UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

// `url` as it may be logged or shown in an error: user information
// (`user:password@`) becomes `***@` and the query `?***`, since both often
// carry credentials (signed or tokenised URLs). The rest is unchanged.
std::string RedactUrl(std::string_view url);

// Standard base64 (RFC 4648 section 4), padded.
std::string Base64(std::string_view bytes);

}  // namespace idemgate
