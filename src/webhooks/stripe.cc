#include "webhooks/internal.h"

#include <cstdint>
#include <string>
#include <vector>

namespace idemgate::webhooks::internal {

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

  const std::optional<std::int64_t> t = ParseUnixSeconds(*timestamp);
  if (!t) return Invalid("Stripe-Signature timestamp is not a decimal integer");

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

  if (!WithinTolerance(request.now_unix_seconds, *t, kStripeToleranceSeconds)) {
    return Invalid("Stripe-Signature timestamp is outside the tolerance");
  }

  const auto body = ParseJson(request.body);
  if (!body) return NoId("body is not JSON");
  const json::object* object = body->if_object();
  const json::value* id = object == nullptr ? nullptr : object->if_contains("id");
  if (id == nullptr || !id->is_string() || id->get_string().empty()) return NoId("body has no string \"id\"");
  return Ok("stripe-" + std::string(id->get_string()));
}

}  // namespace idemgate::webhooks::internal
