#include "webhooks/internal.h"

#include <string>

namespace idemgate::webhooks::internal {

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

}  // namespace idemgate::webhooks::internal
