#include "webhooks/internal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <boost/json/parse.hpp>
#include <charconv>
#include <climits>
#include <cstddef>
#include <string>
#include <utility>

#include "common/ascii.h"
#include "common/json_limits.h"

// The parts every provider uses: text, encodings, MACs, headers, forms, JSON.
namespace idemgate::webhooks::internal {

namespace {

constexpr std::string_view kFormType = "application/x-www-form-urlencoded";

}  // namespace

Translation Ok(std::string key) { return {Outcome::kOk, std::move(key), {}}; }
Translation Invalid(std::string detail) { return {Outcome::kSignatureInvalid, {}, std::move(detail)}; }
Translation NoId(std::string detail) { return {Outcome::kNoId, {}, std::move(detail)}; }

// ---------------------------------------------------------------------------
// Text

std::string_view Trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

void AppendKeyPart(std::string& key, std::string_view value) {
  for (const char c : value) {
    if (c == '~') {
      key.append("~7E");
    } else if (c == '-') {
      key.append("~2D");
    } else {
      key.push_back(c);
    }
  }
}

// The value of a hex digit (either case), or -1.
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The bytes that `hex` spells, or nothing when it is not an even number of hex digits.
std::optional<std::string> DecodeHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int high = HexValue(hex[i]);
    const int low = HexValue(hex[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    out.push_back(static_cast<char>(high * 16 + low));
  }
  return out;
}

bool IsBase64Alphabet(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

// The bytes of standard, padded base64, or nothing when `text` is not that.
// EVP_DecodeBlock alone would take '=' anywhere and count padding as zero
// bytes, so the text is checked here and the padding taken off the length.
std::optional<std::string> DecodeBase64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > INT_MAX) return std::nullopt;
  std::size_t padding = 0;
  if (text.back() == '=') ++padding;
  if (text[text.size() - 2] == '=') ++padding;
  if (padding == 1 && text.back() != '=') return std::nullopt;  // "xx=x"
  for (std::size_t i = 0; i < text.size() - padding; ++i) {
    if (!IsBase64Alphabet(text[i])) return std::nullopt;
  }
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0 || static_cast<std::size_t>(n) != out.size()) return std::nullopt;
  out.resize(out.size() - padding);
  return out;
}

std::optional<std::int64_t> ParseUnixSeconds(std::string_view text) {
  std::int64_t t = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), t);
  if (text.empty() || text.front() == '-' || ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return t;
}

bool WithinTolerance(std::int64_t now, std::int64_t then, std::int64_t tolerance) {
  // Both are at most 2^63 apart from zero, so their distance fits unsigned 64 bits.
  const auto n = static_cast<std::uint64_t>(now);
  const auto t = static_cast<std::uint64_t>(then);
  const std::uint64_t distance = now >= then ? n - t : t - n;
  return distance <= static_cast<std::uint64_t>(tolerance);
}

// ---------------------------------------------------------------------------
// Cryptography

// Never null, even for an empty view (OpenSSL wants a pointer).
const unsigned char* BytesOf(std::string_view s) {
  static constexpr unsigned char kNothing = 0;
  return s.data() == nullptr ? &kNothing : reinterpret_cast<const unsigned char*>(s.data());
}

std::size_t MacSize(Algorithm algorithm) { return algorithm == Algorithm::kSha1 ? 20 : 32; }

// The raw HMAC of `data` under `key`; empty if OpenSSL fails, which then matches nothing.
std::string Hmac(Algorithm algorithm, std::string_view key, std::string_view data) {
  if (key.size() > INT_MAX) return {};
  const EVP_MD* md = algorithm == Algorithm::kSha1 ? EVP_sha1() : EVP_sha256();
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (HMAC(md, BytesOf(key), static_cast<int>(key.size()), BytesOf(data), data.size(), out, &size) == nullptr) {
    return {};
  }
  return std::string(reinterpret_cast<const char*>(out), size);
}

// Compares two MACs in time that depends only on their (public) length.
bool MacEquals(std::string_view expected, std::string_view sent) {
  return !expected.empty() && expected.size() == sent.size() &&
         CRYPTO_memcmp(expected.data(), sent.data(), expected.size()) == 0;
}

// ---------------------------------------------------------------------------
// Headers and forms

Lookup FindHeader(const std::vector<HeaderField>& headers, std::string_view name) {
  Lookup found;
  for (const HeaderField& field : headers) {
    if (!EqualsIgnoreCaseAscii(field.name, name)) continue;
    if (found.count++ == 0) found.value = Trim(field.value);
  }
  return found;
}

Lookup FindField(const Form& form, std::string_view name) {
  Lookup found;
  for (const auto& [field, value] : form) {
    if (field != name) continue;
    if (found.count++ == 0) found.value = value;
  }
  return found;
}

// A signature header's value, or the reason there is not exactly one.
std::optional<std::string_view> SignatureHeader(const WebhookRequest& request, std::string_view name,
                                                std::string* problem) {
  const Lookup found = FindHeader(request.headers, name);
  if (found.count == 0) {
    *problem = "missing " + std::string(name) + " header";
    return std::nullopt;
  }
  if (found.count > 1) {
    *problem = std::string(name) + " header appears more than once";
    return std::nullopt;
  }
  return found.value;
}

// An id header's non-empty value, or the reason there is not exactly one.
std::optional<std::string_view> IdHeader(const WebhookRequest& request, std::string_view name, std::string* problem) {
  const Lookup found = FindHeader(request.headers, name);
  if (found.count > 1) {
    *problem = std::string(name) + " header appears more than once";
    return std::nullopt;
  }
  if (found.value.empty()) {
    *problem = "missing " + std::string(name) + " header";
    return std::nullopt;
  }
  return found.value;
}

// Percent-decodes a form name or value ('+' is a space); nothing on a bad escape.
std::optional<std::string> DecodeFormComponent(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] != '%') {
      out.push_back(s[i]);
    } else {
      if (i + 2 >= s.size()) return std::nullopt;
      const int high = HexValue(s[i + 1]);
      const int low = HexValue(s[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      out.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    }
  }
  return out;
}

// Parses application/x-www-form-urlencoded text: pairs split on '&', name and
// value on the first '='; empty pairs are skipped.
std::optional<Form> ParseForm(std::string_view text) {
  Form form;
  while (!text.empty()) {
    const std::size_t amp = text.find('&');
    const std::string_view pair = text.substr(0, amp);
    text = amp == std::string_view::npos ? std::string_view() : text.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    auto name = DecodeFormComponent(pair.substr(0, eq));
    auto value = DecodeFormComponent(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1));
    if (!name || !value) return std::nullopt;
    form.emplace_back(std::move(*name), std::move(*value));
  }
  return form;
}

// The body's fields when it is declared (once) as a form and parses as one.
std::optional<Form> FormBody(const WebhookRequest& request) {
  const Lookup type = FindHeader(request.headers, "Content-Type");
  if (type.count != 1) return std::nullopt;
  const std::string_view media_type = Trim(type.value.substr(0, type.value.find(';')));
  if (!EqualsIgnoreCaseAscii(media_type, kFormType)) return std::nullopt;
  return ParseForm(request.body);
}

// ---------------------------------------------------------------------------
// JSON

std::optional<json::value> ParseJson(std::string_view text) {
  boost::system::error_code ec;
  json::parse_options options;
  options.max_depth = kMaxJsonDepth;  // as the fingerprint's; Boost.JSON's default is 32
  json::value value = json::parse(json::string_view(text.data(), text.size()), ec, {}, options);
  if (ec) return std::nullopt;
  return value;
}

}  // namespace idemgate::webhooks::internal
