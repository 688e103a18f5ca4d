#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// Webhook senders (SPEC §7): each provider's signature check and the event
// id it carries, which becomes the idempotency key. Pure functions over one
// buffered request; no I/O, no clock (the caller passes the time). Safe to
// call from any thread.
namespace idemgate::webhooks {

enum class Provider { kStripe, kGitHub, kTwilio, kTwilioEventStreams, kGeneric, kStandardWebhooks };

// "stripe", "github", "twilio", "twilio_event_streams", "generic", "standard_webhooks".
std::optional<Provider> ProviderFromName(std::string_view name);
std::string_view ProviderName(Provider provider);

// How a `generic` sender signs and names its events.
struct GenericSpec {
  enum class Algorithm { kSha256, kSha1 };
  enum class Encoding { kHex, kBase64 };

  std::string header;  // the signature's header, matched case-insensitively
  Algorithm algorithm = Algorithm::kSha256;
  Encoding encoding = Encoding::kHex;
  std::string prefix;  // text before the signature in the header (e.g. "sha256="); must be there when set
  // Where the event id is; exactly one is set.
  std::string id_header;                    // a request header
  std::string id_pointer;                   // a JSON Pointer into a JSON body
  std::vector<std::string> id_form_fields;  // fields of a form body, joined with '-'
};

struct HeaderField {
  std::string_view name;
  std::string_view value;
};

// The request as the sender made it.
struct WebhookRequest {
  // The URL the sender called: scheme, host, port if any, path and query.
  // Only Twilio signs it (and senders differ on writing a port, so the forms
  // with and without one are tried).
  std::string_view url;
  std::vector<HeaderField> headers;  // every header line, as received
  std::string_view body;
  std::int64_t now_unix_seconds = 0;  // for Stripe's timestamp tolerance
};

// Stripe's tolerance between its signature timestamp and now, either way.
inline constexpr std::int64_t kStripeToleranceSeconds = 300;
// The same for Standard Webhooks (the specification recommends five minutes).
inline constexpr std::int64_t kStandardWebhooksToleranceSeconds = 300;

// The HMAC key of a Standard Webhooks secret ("whsec_" + base64, or the
// base64 alone), or nothing when the secret is not that.
std::optional<std::string> StandardWebhooksKey(std::string_view secret);

struct Translation {
  enum class Outcome {
    kOk,                // verified; `key` holds the event's key
    kSignatureInvalid,  // missing, malformed, wrong or (Stripe) stale signature: 401 signature-invalid
    kNoId,              // verified, but no event id in it: 400 translation-failed
  };
  Outcome outcome = Outcome::kSignatureInvalid;
  std::string key;     // kOk: "stripe-evt_…", "github-<delivery>", "twilio-<sid>-<status>", "twilio-<token>",
                       // "webhook-<id>", generic: the id
  std::string detail;  // otherwise: a short reason for the problem's detail; never contains the secret
};

// Verifies `request` as `provider` signs it with `secret` (in constant time)
// and lifts the event id. `generic` must be set for Provider::kGeneric.
//
//  - stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=…][,v0=…]`; a v1
//    HMAC-SHA256 of "<t>.<body>" must match, and |now - t| ≤ 300 s. Key
//    "stripe-" + the JSON body's top-level "id" (a string).
//  - github: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body.
//    Key "github-" + `X-GitHub-Delivery`.
//  - twilio: `X-Twilio-Signature`, base64 HMAC-SHA1 of the URL followed, for
//    a form body (application/x-www-form-urlencoded), by every parameter's
//    name and value sorted by name (then value); when the URL's query has
//    `bodySHA256`, of the URL alone, and that parameter must equal the hex
//    SHA-256 of the body. A non-empty body that is not a form (or does not
//    parse as one) is refused without `bodySHA256`, which alone would sign
//    it. The URL is tried as given and with its port removed (any port), or
//    with the default port (:443, :80) added when it has none, as senders
//    differ (Twilio drops an https URL's port before signing). Key "twilio-" +
//    the form's MessageSid + "-" + MessageStatus (SmsStatus when there is
//    no MessageStatus; just the sid when there is neither), '-' in either
//    written "~2D" and '~' "~7E" (Twilio's own hold neither).
//  - twilio_event_streams: signature as twilio; key "twilio-" +
//    `I-Twilio-Idempotency-Token`.
//  - standard_webhooks (standardwebhooks.com, Svix): `webhook-id`,
//    `webhook-timestamp`, `webhook-signature` (or the same with `svix-`);
//    one of the space-separated "v1,<base64>" signatures must be the
//    HMAC-SHA256 of "<id>.<timestamp>.<body>" under the secret's base64
//    bytes (after an optional "whsec_"), and |now - timestamp| ≤ 300 s.
//    Key "webhook-" + the id; a verified id that is empty or holds a '.'
//    is missing (another cut of the signed text could name another id).
//  - generic: `generic->header` holds `prefix` + the HMAC of the body,
//    hex (either case) or base64. Key: the id as it is (no prefix) from
//    the header, the JSON Pointer (a string, or an integer as its decimal
//    text) or the form fields joined with '-' (escaped as twilio's, when
//    there are several).
// A header or form field the provider needs that appears more than once is
// refused as invalid (a signature) or missing (an id); an empty id is
// missing. A form body is one declared application/x-www-form-urlencoded.
Translation Translate(Provider provider, const GenericSpec* generic, std::string_view secret,
                      const WebhookRequest& request);

}  // namespace idemgate::webhooks
