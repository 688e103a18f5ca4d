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

}  // namespace

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
