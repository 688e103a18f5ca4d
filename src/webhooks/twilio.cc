#include "webhooks/internal.h"

#include <algorithm>
#include <optional>
#include <string>

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

  bool matched = MacEquals(Hmac(Algorithm::kSha1, secret, std::string(request.url) + suffix), *sent);
  if (const auto other = OtherPortForm(request.url)) {
    matched = MacEquals(Hmac(Algorithm::kSha1, secret, *other + suffix), *sent) || matched;
  }
  if (!matched) return "X-Twilio-Signature does not match";
  if (body_sha256.count == 1 && !EqualsIgnoreCaseAscii(body_sha256.value, Sha256Hex(request.body))) {
    return "the body does not match the URL's bodySHA256";
  }
  return std::nullopt;
}

// The key's fields, as Twilio names them.
constexpr std::string_view kSidField = "MessageSid";
constexpr std::string_view kStatusField = "MessageStatus";
constexpr std::string_view kSmsStatusField = "SmsStatus";

bool IsSidDigit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
bool IsStatusChar(char c) { return (c >= 'a' && c <= 'z') || c == '_'; }

// A sid as Twilio writes them: two capital letters and lower-case hex digits
// (SM, MM + 32 of them).
bool IsSid(std::string_view v) {
  return v.size() > 2 && v[0] >= 'A' && v[0] <= 'Z' && v[1] >= 'A' && v[1] <= 'Z' &&
         std::all_of(v.begin() + 2, v.end(), IsSidDigit);
}

bool IsStatus(std::string_view v) { return !v.empty() && std::all_of(v.begin(), v.end(), IsStatusChar); }

// Twilio signs the names and values of a form run together, not where one
// ends and the next begins, so a captured delivery can be sent again with
// its text cut differently ("MessageStatus=deliv&ered…=…", a name
// "MessageStatusdel") under the same signature; read as sent, that would be
// another key and would run again. Refused here: every way of moving a cut
// that changes the key shows in the form. The sid and status hold only
// their own characters (so neither can have taken in a following name, which
// starts with a capital letter); the field sorted after each does not start
// with one of those characters (so neither can have lost its tail to it); no
// name is a key field's name cut short or run on; and a key field that is
// missing is not hidden in another field's text. `sorted` is the form in
// the signature's order. Returns why when the form could be a re-cut.
std::optional<std::string> RecutProblem(const Form& sorted, const Lookup& sid, std::string_view status_name,
                                        const Lookup& status) {
  if (!IsSid(sid.value)) return "MessageSid is not a Twilio sid (two capital letters, then hex digits)";
  if (status.count == 1 && !IsStatus(status.value)) {
    return "the message status is not a Twilio status (lower-case letters and '_')";
  }
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    const std::string_view name = sorted[i].first;
    for (const std::string_view field : {kSidField, kStatusField, kSmsStatusField}) {
      if (name != field && (field.starts_with(name) || name.starts_with(field))) {
        return "the form field '" + std::string(name) + "' could be " + std::string(field) + " cut elsewhere";
      }
    }
    if (i + 1 == sorted.size() || sorted[i + 1].first.empty()) continue;
    const char next = sorted[i + 1].first.front();
    if ((name == kSidField && IsSidDigit(next)) ||
        (name == status_name && status.count == 1 && IsStatusChar(next))) {
      return "the field after " + std::string(name) + " could hold the end of its value";
    }
  }
  const auto hidden = [&](std::string_view field) {
    return std::any_of(sorted.begin(), sorted.end(), [&](const auto& f) {
      return f.first.find(field) != std::string::npos || f.second.find(field) != std::string::npos;
    });
  };
  if (FindField(sorted, kStatusField).count == 0 && hidden(kStatusField)) {
    return "the form has no MessageStatus field but holds its name";
  }
  if (status.count == 0 && hidden(kSmsStatusField)) return "the form has no SmsStatus field but holds its name";
  return std::nullopt;
}

}  // namespace

Translation VerifyTwilio(std::string_view secret, const WebhookRequest& request) {
  if (auto problem = TwilioSignatureProblem(secret, request)) return Invalid(std::move(*problem));

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
  // With the URL's bodySHA256 the body is signed byte for byte, cut and all.
  if (FindField(QueryOf(request.url), "bodySHA256").count == 0) {
    Form sorted = *form;  // a copy: sid and status view into *form
    std::sort(sorted.begin(), sorted.end());
    if (auto problem = RecutProblem(sorted, sid, status_name, status)) return NoId(std::move(*problem));
  }

  // Sid and status are escaped (AppendKeyPart), so that "SMx-a" + "b",
  // "SMx" + "a-b" and the sid "SMx-a-b" alone are three keys. Twilio's sids
  // and statuses hold no '-' or '~', so their keys read as they are.
  std::string key = "twilio-";
  AppendKeyPart(key, sid.value);
  if (!status.value.empty()) {
    key.push_back('-');
    AppendKeyPart(key, status.value);
  }
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

}  // namespace idemgate::webhooks::internal
