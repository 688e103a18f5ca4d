#include "webhooks/providers.h"

#include "webhooks/internal.h"

namespace idemgate::webhooks {

using internal::Invalid;
using internal::VerifyGeneric;
using internal::VerifyGitHub;
using internal::VerifyStandardWebhooks;
using internal::VerifyStripe;
using internal::VerifyTwilio;
using internal::VerifyTwilioEventStreams;

std::optional<Provider> ProviderFromName(std::string_view name) {
  for (const Provider provider :
       {Provider::kStripe, Provider::kGitHub, Provider::kTwilio, Provider::kTwilioEventStreams, Provider::kGeneric,
        Provider::kStandardWebhooks}) {
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
    case Provider::kStandardWebhooks:
      return "standard_webhooks";
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
    case Provider::kStandardWebhooks:
      return VerifyStandardWebhooks(secret, request);
  }
  return Invalid("unknown provider");
}

}  // namespace idemgate::webhooks
