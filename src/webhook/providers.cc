#include "webhook/providers.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <charconv>
#include <climits>
#include <cstddef>
#include <string>
#include <utility>

namespace idemgate::webhook {

namespace {

namespace json = boost::json;

using Algorithm = GenericSpec::Algorithm;
using Encoding = GenericSpec::Encoding;
using Outcome = Translation::Outcome;

// Form fields in the order they were sent, decoded.
using Form = std::vector<std::pair<std::string, std::string>>;

constexpr std::string_view kFormType = "application/x-www-form-urlencoded";

Translation Ok(std::string key) { return {Outcome::kOk, std::move(key), {}}; }
Translation Invalid(std::string detail) { return {Outcome::kSignatureInvalid, {}, std::move(detail)}; }
Translation NoId(std::string detail) { return {Outcome::kNoId, {}, std::move(detail)}; }

// ---------------------------------------------------------------------------
// Text

char LowerAscii(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (LowerAscii(a[i]) != LowerAscii(b[i])) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
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

std::string EncodeHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(kDigits[u >> 4]);
    out.push_back(kDigits[u & 0x0f]);
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

std::string Sha256Hex(std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(BytesOf(data), data.size(), out, &size, EVP_sha256(), nullptr) != 1) return {};
  return EncodeHex(std::string_view(reinterpret_cast<const char*>(out), size));
}

// ---------------------------------------------------------------------------
// Headers and forms

// What a name maps to among header lines or form fields. `value` views into
// what was searched, which must outlive it.
struct Lookup {
  std::size_t count = 0;   // how many times the name appears
  std::string_view value;  // the first one's value (a header's trimmed)
};

Lookup FindHeader(const std::vector<HeaderField>& headers, std::string_view name) {
  Lookup found;
  for (const HeaderField& field : headers) {
    if (!EqualsIgnoreCase(field.name, name)) continue;
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
  if (!EqualsIgnoreCase(media_type, kFormType)) return std::nullopt;
  return ParseForm(request.body);
}

// ---------------------------------------------------------------------------
// JSON

std::optional<json::value> ParseJson(std::string_view text) {
  boost::system::error_code ec;
  json::value value = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return std::nullopt;
  return value;
}

// One reference token of a JSON Pointer with ~1 → '/' and ~0 → '~'; nothing on another '~'.
std::optional<std::string> UnescapePointerToken(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size(); ++i) {
    if (token[i] != '~') {
      out.push_back(token[i]);
    } else if (i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      out.push_back(token[i + 1] == '0' ? '~' : '/');
      ++i;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

// An array index token: "0" or digits without a leading zero.
std::optional<std::size_t> ArrayIndex(std::string_view token) {
  if (token.empty() || (token.size() > 1 && token.front() == '0')) return std::nullopt;
  std::size_t index = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), index);
  if (ec != std::errc() || end != token.data() + token.size()) return std::nullopt;
  return index;
}

// Resolves an RFC 6901 JSON Pointer in `root`; null when it names nothing.
const json::value* FindPointer(const json::value& root, std::string_view pointer) {
  if (pointer.empty()) return &root;
  if (pointer.front() != '/') return nullptr;
  const json::value* at = &root;
  std::string_view rest = pointer.substr(1);
  while (true) {
    const std::size_t slash = rest.find('/');
    const auto token = UnescapePointerToken(rest.substr(0, slash));
    if (!token) return nullptr;
    if (const json::object* object = at->if_object()) {
      const auto it = object->find(*token);
      if (it == object->end()) return nullptr;
      at = &it->value();
    } else if (const json::array* array = at->if_array()) {
      const auto index = ArrayIndex(*token);
      if (!index || *index >= array->size()) return nullptr;
      at = &(*array)[*index];
    } else {
      return nullptr;
    }
    if (slash == std::string_view::npos) return at;
    rest.remove_prefix(slash + 1);
  }
}

// ---------------------------------------------------------------------------
// Stripe: `t=<unix>,v1=<hex>…`; HMAC-SHA256 of "<t>.<body>"; key from the body's "id".

Translation VerifyStripe(std::string_view secret, const WebhookRequest& request) {
  std::string problem;
  const auto header = SignatureHeader(request, "Stripe-Signature", &problem);
  if (!header) return Invalid(problem);

  std::optional<std::string_view> timestamp;
  std::vector<std::string_view> v1s;
  std::string_view items = *header;
  while (!items.empty()) {
    const std::size_t comma = items.find(',');
    const std::string_view item = Trim(items.substr(0, comma));
    items = comma == std::string_view::npos ? std::string_view() : items.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    if (name == "t") {
      if (timestamp) return Invalid("Stripe-Signature has more than one timestamp");
      timestamp = value;
    } else if (name == "v1") {
      v1s.push_back(value);
    }
  }
  if (!timestamp) return Invalid("Stripe-Signature has no timestamp");
  if (v1s.empty()) return Invalid("Stripe-Signature has no v1 signature");

  std::int64_t t = 0;
  const auto [end, ec] = std::from_chars(timestamp->data(), timestamp->data() + timestamp->size(), t);
  if (timestamp->empty() || timestamp->front() == '-' || ec != std::errc() ||
      end != timestamp->data() + timestamp->size()) {
    return Invalid("Stripe-Signature timestamp is not a decimal integer");
  }

  std::string signed_payload;
  signed_payload.reserve(timestamp->size() + 1 + request.body.size());
  signed_payload.append(*timestamp).append(".").append(request.body);
  const std::string expected = Hmac(Algorithm::kSha256, secret, signed_payload);
  bool matched = false;
  for (const std::string_view v1 : v1s) {
    const auto sent = DecodeHex(v1);
    if (sent && MacEquals(expected, *sent)) matched = true;
  }
  if (!matched) return Invalid("no Stripe-Signature v1 signature matches");

  // Both are at most 2^63 apart from zero, so their distance fits unsigned 64 bits.
  const auto now = static_cast<std::uint64_t>(request.now_unix_seconds);
  const auto then = static_cast<std::uint64_t>(t);
  const std::uint64_t distance = request.now_unix_seconds >= t ? now - then : then - now;
  if (distance > static_cast<std::uint64_t>(kStripeToleranceSeconds)) {
    return Invalid("Stripe-Signature timestamp is outside the tolerance");
  }

  const auto body = ParseJson(request.body);
  if (!body) return NoId("body is not JSON");
  const json::object* object = body->if_object();
  const json::value* id = object == nullptr ? nullptr : object->if_contains("id");
  if (id == nullptr || !id->is_string() || id->get_string().empty()) return NoId("body has no string \"id\"");
  return Ok("stripe-" + std::string(id->get_string()));
}

// ---------------------------------------------------------------------------
// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body; key from X-GitHub-Delivery.

Translation VerifyGitHub(std::string_view secret, const WebhookRequest& request) {
  constexpr std::string_view kPrefix = "sha256=";
  std::string problem;
  const auto header = SignatureHeader(request, "X-Hub-Signature-256", &problem);
  if (!header) return Invalid(problem);
  if (header->substr(0, kPrefix.size()) != kPrefix) return Invalid("X-Hub-Signature-256 does not start with sha256=");
  const auto sent = DecodeHex(header->substr(kPrefix.size()));
  if (!sent || sent->size() != MacSize(Algorithm::kSha256)) {
    return Invalid("X-Hub-Signature-256 is not a hex SHA-256 HMAC");
  }
  if (!MacEquals(Hmac(Algorithm::kSha256, secret, request.body), *sent)) {
    return Invalid("X-Hub-Signature-256 does not match");
  }

  const auto delivery = IdHeader(request, "X-GitHub-Delivery", &problem);
  if (!delivery) return NoId(problem);
  return Ok("github-" + std::string(*delivery));
}

// ---------------------------------------------------------------------------
// Twilio: `X-Twilio-Signature`, base64 HMAC-SHA1 of the URL and the sorted
// form, or of the URL alone with the body's SHA-256 in its bodySHA256.

// The URL with its default port removed when it has it, or added when it has
// no port; nothing when the scheme has no default port or another is given.
std::optional<std::string> OtherPortForm(std::string_view url) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::nullopt;
  const std::string_view scheme = url.substr(0, scheme_end);
  std::string_view port;
  if (EqualsIgnoreCase(scheme, "https")) {
    port = ":443";
  } else if (EqualsIgnoreCase(scheme, "http")) {
    port = ":80";
  } else {
    return std::nullopt;
  }
  const std::size_t host_begin = scheme_end + 3;
  const std::size_t host_end = std::min(url.find_first_of("/?#", host_begin), url.size());
  std::string_view authority = url.substr(host_begin, host_end - host_begin);
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) authority.remove_prefix(at + 1);
  if (authority.empty()) return std::nullopt;
  std::string other(url.substr(0, host_end));
  const std::size_t colon = authority.rfind(':');
  const std::size_t bracket = authority.rfind(']');
  const bool has_port = colon != std::string_view::npos && (bracket == std::string_view::npos || colon > bracket);
  if (!has_port) {
    other.append(port);
  } else if (authority.substr(colon) == port) {
    other.resize(other.size() - port.size());
  } else {
    return std::nullopt;
  }
  other.append(url.substr(host_end));
  return other;
}

// The URL's query parameters (without any fragment), or none when it has none or they do not parse.
Form QueryOf(std::string_view url) {
  const std::size_t question = url.find('?');
  if (question == std::string_view::npos) return {};
  std::string_view query = url.substr(question + 1);
  query = query.substr(0, query.find('#'));
  return ParseForm(query).value_or(Form{});
}

// Returns nothing when the request carries a valid Twilio signature, else why it does not.
std::optional<std::string> TwilioSignatureProblem(std::string_view secret, const WebhookRequest& request) {
  std::string problem;
  const auto header = SignatureHeader(request, "X-Twilio-Signature", &problem);
  if (!header) return problem;
  const auto sent = DecodeBase64(*header);
  if (!sent || sent->size() != MacSize(Algorithm::kSha1)) return "X-Twilio-Signature is not a base64 SHA-1 HMAC";

  const Form query = QueryOf(request.url);
  const Lookup body_sha256 = FindField(query, "bodySHA256");
  if (body_sha256.count > 1) return "the URL has more than one bodySHA256";
  std::string suffix;  // what follows the URL in the signed text
  if (body_sha256.count == 0) {
    if (auto form = FormBody(request)) {
      std::sort(form->begin(), form->end());
      for (const auto& [name, value] : *form) suffix.append(name).append(value);
    }
  }

  bool matched = MacEquals(Hmac(Algorithm::kSha1, secret, std::string(request.url) + suffix), *sent);
  if (const auto other = OtherPortForm(request.url)) {
    matched = MacEquals(Hmac(Algorithm::kSha1, secret, *other + suffix), *sent) || matched;
  }
  if (!matched) return "X-Twilio-Signature does not match";
  if (body_sha256.count == 1 && !EqualsIgnoreCase(body_sha256.value, Sha256Hex(request.body))) {
    return "the body does not match the URL's bodySHA256";
  }
  return std::nullopt;
}

Translation VerifyTwilio(std::string_view secret, const WebhookRequest& request) {
  if (auto problem = TwilioSignatureProblem(secret, request)) return Invalid(std::move(*problem));

  const auto form = FormBody(request);
  if (!form) return NoId("body is not a form");
  const Lookup sid = FindField(*form, "MessageSid");
  if (sid.count > 1) return NoId("MessageSid appears more than once");
  if (sid.value.empty()) return NoId("form has no MessageSid");
  Lookup status = FindField(*form, "MessageStatus");
  if (status.count == 0) status = FindField(*form, "SmsStatus");
  if (status.count > 1) return NoId("the message status appears more than once");

  std::string key = "twilio-" + std::string(sid.value);
  if (!status.value.empty()) key.append("-").append(status.value);
  return Ok(std::move(key));
}

// Twilio Event Streams: Twilio's signature; key from I-Twilio-Idempotency-Token.
Translation VerifyTwilioEventStreams(std::string_view secret, const WebhookRequest& request) {
  if (auto problem = TwilioSignatureProblem(secret, request)) return Invalid(std::move(*problem));

  std::string problem;
  const auto token = IdHeader(request, "I-Twilio-Idempotency-Token", &problem);
  if (!token) return NoId(problem);
  return Ok("twilio-" + std::string(*token));
}

// ---------------------------------------------------------------------------
// Generic: `prefix` + hex or base64 HMAC of the body in a configured header;
// the id from a header, a JSON Pointer or form fields.

Translation GenericId(const GenericSpec& spec, const WebhookRequest& request) {
  const int sources = !spec.id_header.empty() + !spec.id_pointer.empty() + !spec.id_form_fields.empty();
  if (sources != 1) return NoId("generic provider needs exactly one id source");

  std::string problem;
  if (!spec.id_header.empty()) {
    const auto id = IdHeader(request, spec.id_header, &problem);
    if (!id) return NoId(problem);
    return Ok(std::string(*id));
  }

  if (!spec.id_pointer.empty()) {
    const auto body = ParseJson(request.body);
    if (!body) return NoId("body is not JSON");
    const json::value* id = FindPointer(*body, spec.id_pointer);
    if (id != nullptr && id->is_string() && !id->get_string().empty()) return Ok(std::string(id->get_string()));
    if (id != nullptr && id->is_int64()) return Ok(std::to_string(id->get_int64()));
    if (id != nullptr && id->is_uint64()) return Ok(std::to_string(id->get_uint64()));
    return NoId("the id pointer names no string or integer");
  }

  const auto form = FormBody(request);
  if (!form) return NoId("body is not a form");
  std::string key;
  for (const std::string& name : spec.id_form_fields) {
    const Lookup field = FindField(*form, name);
    if (field.count > 1) return NoId("id field " + name + " appears more than once");
    if (field.value.empty()) return NoId("missing id field " + name);
    if (!key.empty()) key.push_back('-');
    key.append(field.value);
  }
  return Ok(std::move(key));
}

Translation VerifyGeneric(const GenericSpec* spec, std::string_view secret, const WebhookRequest& request) {
  if (spec == nullptr) return Invalid("generic provider without settings");
  std::string problem;
  const auto header = SignatureHeader(request, spec->header, &problem);
  if (!header) return Invalid(problem);
  if (header->substr(0, spec->prefix.size()) != spec->prefix) {
    return Invalid(spec->header + " does not start with its prefix");
  }
  const std::string_view text = header->substr(spec->prefix.size());
  const auto sent = spec->encoding == Encoding::kHex ? DecodeHex(text) : DecodeBase64(text);
  if (!sent || sent->size() != MacSize(spec->algorithm)) return Invalid(spec->header + " is not an HMAC");
  if (!MacEquals(Hmac(spec->algorithm, secret, request.body), *sent)) return Invalid(spec->header + " does not match");
  return GenericId(*spec, request);
}

}  // namespace

std::optional<Provider> ProviderFromName(std::string_view name) {
  for (const Provider provider :
       {Provider::kStripe, Provider::kGitHub, Provider::kTwilio, Provider::kTwilioEventStreams, Provider::kGeneric}) {
    if (name == ProviderName(provider)) return provider;
  }
  return std::nullopt;
}

std::string_view ProviderName(Provider provider) {
  switch (provider) {
    case Provider::kStripe:
      return "stripe";
    case Provider::kGitHub:
      return "github";
    case Provider::kTwilio:
      return "twilio";
    case Provider::kTwilioEventStreams:
      return "twilio_event_streams";
    case Provider::kGeneric:
      return "generic";
  }
  return {};
}

Translation Translate(Provider provider, const GenericSpec* generic, std::string_view secret,
                      const WebhookRequest& request) {
  switch (provider) {
    case Provider::kStripe:
      return VerifyStripe(secret, request);
    case Provider::kGitHub:
      return VerifyGitHub(secret, request);
    case Provider::kTwilio:
      return VerifyTwilio(secret, request);
    case Provider::kTwilioEventStreams:
      return VerifyTwilioEventStreams(secret, request);
    case Provider::kGeneric:
      return VerifyGeneric(generic, secret, request);
  }
  return Invalid("unknown provider");
}

}  // namespace idemgate::webhook
