#pragma once

#include <string>
#include <string_view>

// Text helpers for output that must be valid JSON, plain ASCII or one
// terminal line whatever bytes it shows (the admin API's records, idemctl's
// dead letters, idemgate's config errors).
namespace idemgate {

// True when `bytes` is well-formed UTF-8 (no overlong forms, surrogates or
// code points above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// `bytes` with each ill-formed UTF-8 sequence replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

// `text` as it may go to a terminal or into a tab-separated row: text from
// a server, a file or a config (a problem's code, a queue entry, a YAML key)
// could otherwise break a line or a row, or send the terminal escape
// sequences. Control characters are escaped (\t, \n, \r, else \xNN; DEL
// \x7f; the C1 controls, U+0080..U+009F, as \u0080..\u009f), and so is each
// byte that is not UTF-8 (\xNN); a backslash stays as it is.
std::string Printable(std::string_view text);

// `url` as it may be logged or shown in an error: user information
// (`user:password@`) becomes `***@` and the query `?***`, since both often
// carry credentials (signed or tokenised URLs). The rest is unchanged.
std::string RedactUrl(std::string_view url);

// Standard base64 (RFC 4648 section 4), padded.
std::string Base64(std::string_view bytes);

}  // namespace idemgate
