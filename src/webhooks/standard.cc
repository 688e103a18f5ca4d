#include <cstdint>
#include <string>

#include "webhooks/internal.h"

namespace idemgate::webhooks::internal {

// ---------------------------------------------------------------------------
// Standard Webhooks (standardwebhooks.com; Svix and the services that send
// through it): `webhook-id`, `webhook-timestamp` and `webhook-signature`
// (`svix-` names accepted too); a space-separated list of "v1,<base64>"
// signatures, HMAC-SHA256 of "<id>.<timestamp>.<body>" under the secret's
// bytes (base64, after an optional "whsec_"); key from the id, which may
// not be empty or hold a '.'.

namespace {

// The header `name` under the Standard Webhooks prefix, else the Svix one.
std::optional<std::string_view> OneOf(const WebhookRequest& request, std::string_view suffix, std::string* problem) {
  const std::string standard = "webhook-" + std::string(suffix);
  const std::string svix = "svix-" + std::string(suffix);
  if (FindHeader(request.headers, standard).count > 0) return SignatureHeader(request, standard, problem);
  if (FindHeader(request.headers, svix).count > 0) return SignatureHeader(request, svix, problem);
  *problem = "no " + standard + " header";
  return std::nullopt;
}

}  // namespace

Translation VerifyStandardWebhooks(std::string_view secret, const WebhookRequest& request) {
  const auto key = StandardWebhooksKey(secret);
  if (!key) return Invalid("the endpoint's secret is not base64 (whsec_...)");
  std::string problem;
  const auto id = OneOf(request, "id", &problem);
  if (!id) return Invalid(problem);
  const auto timestamp = OneOf(request, "timestamp", &problem);
  if (!timestamp) return Invalid(problem);
  const auto signatures = OneOf(request, "signature", &problem);
  if (!signatures) return Invalid(problem);

  const std::optional<std::int64_t> t = ParseUnixSeconds(*timestamp);
  if (!t) return Invalid("webhook-timestamp is not a decimal integer");

  std::string signed_content;
  signed_content.reserve(id->size() + timestamp->size() + 2 + request.body.size());
  signed_content.append(*id).append(".").append(*timestamp).append(".").append(request.body);
  const std::string expected = Hmac(Algorithm::kSha256, *key, signed_content);
  bool matched = false;
  bool any_v1 = false;
  std::string_view items = *signatures;
  while (!items.empty()) {
    const std::size_t space = items.find(' ');
    const std::string_view item = items.substr(0, space);
    items = space == std::string_view::npos ? std::string_view() : items.substr(space + 1);
    const std::size_t comma = item.find(',');
    if (comma == std::string_view::npos || item.substr(0, comma) != "v1") continue;  // other versions (v1a) skipped
    any_v1 = true;
    const auto sent = DecodeBase64(item.substr(comma + 1));
    if (sent && MacEquals(expected, *sent)) matched = true;
  }
  if (!any_v1) return Invalid("webhook-signature has no v1 signature");
  if (!matched) return Invalid("no webhook-signature v1 signature matches");

  if (!WithinTolerance(request.now_unix_seconds, *t, kStandardWebhooksToleranceSeconds)) {
    return Invalid("webhook-timestamp is outside the tolerance");
  }

  // A signed id the gateway does not take is 400 (kNoId), after the checks
  // above, as for any provider's verified request without a usable id; a
  // missing webhook-id header is 401 above, like the other signed headers.
  //
  // An id holding a '.' stays refused. The MAC covers the text
  // "id.timestamp.body", not where it is cut, and the timestamp is digits.
  // With '.'-free ids the cut is the text's first '.', so a signature names
  // one id. With '.' allowed, a captured delivery whose body holds
  // ".<digits>." could be sent again as id "<id>.<timestamp>.<body up to
  // there>", timestamp <those digits> and the rest of the body: verified,
  // under a key never seen, so run again (when those digits are a time within
  // the tolerance of now; digits naming a future time keep that open until
  // then). The key's charset stops it for a JSON body, whose '{' would be in
  // the id, only while the route's key.charset allows no '{' or '"'; a body
  // that is not JSON meets no such check.
  if (id->empty()) return NoId("webhook-id is empty");
  if (id->find('.') != std::string_view::npos) {
    return NoId("webhook-id holds a '.', which is not taken: the signed text id.timestamp.body could be cut at "
                "another '.' and name another id");
  }
  return Ok("webhook-" + std::string(*id));
}

}  // namespace idemgate::webhooks::internal

namespace idemgate::webhooks {

std::optional<std::string> StandardWebhooksKey(std::string_view secret) {
  constexpr std::string_view kSecretPrefix = "whsec_";
  if (secret.substr(0, kSecretPrefix.size()) == kSecretPrefix) secret.remove_prefix(kSecretPrefix.size());
  auto key = internal::DecodeBase64(secret);
  if (!key || key->empty()) return std::nullopt;
  return key;
}

}  // namespace idemgate::webhooks
