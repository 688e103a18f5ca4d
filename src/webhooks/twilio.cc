#include "webhooks/internal.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/ascii.h"
#include "common/digest.h"

namespace idemgate::webhooks::internal {

// ---------------------------------------------------------------------------
// Twilio: `X-Twilio-Signature`, base64 HMAC-SHA1 of the URL and the sorted
// form, or of the URL alone with the body's SHA-256 in its bodySHA256.

// The URL with its port removed when it has one (whatever the port), or its
// scheme's default port added when it has none; nothing when the scheme has
// no default port. Twilio drops the port of an https URL before signing some
// callbacks, and its own validators accept the URL with the port or without
// any port.
namespace {

std::optional<std::string> OtherPortForm(std::string_view url) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::nullopt;
  const std::string_view scheme = url.substr(0, scheme_end);
  std::string_view port;
  if (EqualsIgnoreCaseAscii(scheme, "https")) {
    port = ":443";
  } else if (EqualsIgnoreCaseAscii(scheme, "http")) {
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
  } else {
    other.resize(other.size() - (authority.size() - colon));
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

// Returns nothing when the request carries a valid Twilio signature, else why
// it does not. `signed_text` (when given) receives the text the signature
// matched: the URL as it was signed (with or without its port) and the
// form's names and values, sorted and run together (none when the URL's
// bodySHA256 signs the body instead).
std::optional<std::string> TwilioSignatureProblem(std::string_view secret, const WebhookRequest& request,
                                                  std::string* signed_text = nullptr) {
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
    auto form = FormBody(request);
    // Twilio signs a body that is not a form through the URL's bodySHA256;
    // without it the signature (over the URL alone) would cover none of it.
    if (!form && !request.body.empty()) {
      return "the body is not a form and the URL has no bodySHA256 to sign it";
    }
    if (form) {
      std::sort(form->begin(), form->end());
      for (const auto& [name, value] : *form) suffix.append(name).append(value);
    }
  }

  std::string text = std::string(request.url) + suffix;
  bool matched = MacEquals(Hmac(Algorithm::kSha1, secret, text), *sent);
  if (const auto other = OtherPortForm(request.url)) {
    std::string other_text = *other + suffix;
    if (MacEquals(Hmac(Algorithm::kSha1, secret, other_text), *sent) && !matched) {
      matched = true;
      text = std::move(other_text);
    }
  }
  if (!matched) return "X-Twilio-Signature does not match";
  if (body_sha256.count == 1 && !EqualsIgnoreCaseAscii(body_sha256.value, Sha256Hex(request.body))) {
    return "the body does not match the URL's bodySHA256";
  }
  if (signed_text != nullptr) *signed_text = std::move(text);
  return std::nullopt;
}

// The key's fields, as Twilio names them.
constexpr std::string_view kSidField = "MessageSid";
constexpr std::string_view kStatusField = "MessageStatus";
constexpr std::string_view kSmsStatusField = "SmsStatus";

bool IsSidDigit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool IsStatusChar(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

// Where `name` occurs in `text`, apart from inside the field name
// "SmsMessageSid" (which holds "MessageSid" and comes with every message).
std::vector<std::size_t> Occurrences(std::string_view text, std::string_view name) {
  std::vector<std::size_t> at;
  for (std::size_t p = text.find(name); p != std::string_view::npos; p = text.find(name, p + 1)) {
    if (name == kSidField && p >= 3 && text.substr(p - 3, 3) == "Sms") continue;
    at.push_back(p);
  }
  return at;
}

// The longest run of `text` from `from` whose characters satisfy `ok`.
std::string_view RunOf(std::string_view text, std::size_t from, bool (*ok)(char)) {
  std::size_t end = from;
  while (end < text.size() && ok(text[end])) ++end;
  return text.substr(from, end - from);
}

// Twilio signs the URL and a form's names and values run together
// (`signed_text`), not where the URL ends or one field ends and the next
// begins: a captured delivery can be sent again, under its signature, cut
// elsewhere (a status run on into the next field, cut short, a name run on
// into its value, a field made of a message body's text, fields moved into
// the URL's query). A key read from the fields as sent would differ from cut
// to cut and run again each time; so it is read from the signed text, which
// is the same however it is cut: the one "MessageSid" in it (not counting the
// field name SmsMessageSid), then two capital letters and lower-case hex
// digits; and the one "MessageStatus", else the one "SmsStatus", then
// lower-case letters and '_'. Where that reading is not unique (a name twice,
// in a message body, or no sid or status of that shape after it), the key is
// "signed-" and the SHA-256 of the signed text: a repeated delivery has the
// same text and is still replayed. Nothing when the text holds no
// "MessageSid" at all.
std::optional<std::string> KeyOfSignedText(std::string_view signed_text) {
  const std::vector<std::size_t> sids = Occurrences(signed_text, kSidField);
  if (sids.empty()) return std::nullopt;
  const auto of_text = [&] { return "twilio-signed-" + Sha256Hex(signed_text); };
  if (sids.size() != 1) return of_text();
  const std::size_t sid_at = sids[0] + kSidField.size();
  if (sid_at + 2 > signed_text.size() || signed_text[sid_at] < 'A' || signed_text[sid_at] > 'Z' ||
      signed_text[sid_at + 1] < 'A' || signed_text[sid_at + 1] > 'Z') {
    return of_text();
  }
  const std::string_view digits = RunOf(signed_text, sid_at + 2, IsSidDigit);
  if (digits.empty()) return of_text();
  std::string key = "twilio-";
  key.append(signed_text.substr(sid_at, 2 + digits.size()));
  std::vector<std::size_t> statuses = Occurrences(signed_text, kStatusField);
  std::string_view status_name = kStatusField;
  if (statuses.empty()) {
    statuses = Occurrences(signed_text, kSmsStatusField);
    status_name = kSmsStatusField;
  }
  if (statuses.size() > 1) return of_text();
  if (statuses.size() == 1) {
    const std::string_view status = RunOf(signed_text, statuses[0] + status_name.size(), IsStatusChar);
    if (status.empty()) return of_text();
    key.push_back('-');
    key.append(status);
  }
  return key;
}

}  // namespace

Translation VerifyTwilio(std::string_view secret, const WebhookRequest& request) {
  std::string signed_text;
  if (auto problem = TwilioSignatureProblem(secret, request, &signed_text)) return Invalid(std::move(*problem));

  // A messaging callback is a form signed through its fields. With the URL's
  // bodySHA256 the signature covers the URL alone, and a URL can be made of
  // another delivery's signed text, a bodySHA256 of the sender's choosing
  // included: such a request makes no key.
  if (FindField(QueryOf(request.url), "bodySHA256").count != 0) {
    return NoId("a messaging callback's form is signed through its fields, not through bodySHA256");
  }
  const auto form = FormBody(request);
  if (!form) return NoId("body is not a form");
  const Lookup sid = FindField(*form, kSidField);
  if (sid.count > 1) return NoId("MessageSid appears more than once");
  if (sid.value.empty()) return NoId("form has no MessageSid");
  Lookup status = FindField(*form, kStatusField);
  std::string_view status_name = kStatusField;
  if (status.count == 0) {
    status = FindField(*form, kSmsStatusField);
    status_name = kSmsStatusField;
  }
  if (status.count > 1) return NoId("the message status appears more than once");
  if (status.count == 1 && status.value.empty()) return NoId(std::string(status_name) + " is empty");
  auto key = KeyOfSignedText(signed_text);
  if (!key) return NoId("form has no MessageSid");
  return Ok(std::move(*key));
}

// Twilio Event Streams: Twilio's signature; key from I-Twilio-Idempotency-Token.
Translation VerifyTwilioEventStreams(std::string_view secret, const WebhookRequest& request) {
  if (auto problem = TwilioSignatureProblem(secret, request)) return Invalid(std::move(*problem));

  std::string problem;
  const auto token = IdHeader(request, "I-Twilio-Idempotency-Token", &problem);
  if (!token) return NoId(problem);
  return Ok("twilio-" + std::string(*token));
}

}  // namespace idemgate::webhooks::internal
