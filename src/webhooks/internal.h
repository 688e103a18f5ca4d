#pragma once

#include <boost/json/value.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "webhooks/providers.h"

// What the provider files share (internal.cc), and each provider's check
// (stripe.cc, github.cc, twilio.cc, generic.cc, standard.cc), which providers.cc
// dispatches to. Not part of the library's interface.
namespace idemgate::webhooks::internal {

namespace json = boost::json;

using Algorithm = GenericSpec::Algorithm;
using Encoding = GenericSpec::Encoding;
using Outcome = Translation::Outcome;

// Form fields in the order they were sent, decoded.
using Form = std::vector<std::pair<std::string, std::string>>;

// What a name maps to among header lines or form fields. `value` views into
// what was searched, which must outlive it.
struct Lookup {
  std::size_t count = 0;   // how many times the name appears
  std::string_view value;  // the first one's value (a header's trimmed)
};

Translation Ok(std::string key);
Translation Invalid(std::string detail);
Translation NoId(std::string detail);

// Text and encodings.
std::string_view Trim(std::string_view s);
// The bytes that `hex` spells (either case), or nothing when it is not an even number of hex digits.
std::optional<std::string> DecodeHex(std::string_view hex);
// The bytes of standard, padded base64, or nothing when `text` is not that.
std::optional<std::string> DecodeBase64(std::string_view text);
// Appends `value` to a key made of several values joined with '-', with '~'
// written "~7E" and '-' "~2D", so that no two lists of values make the same
// key ("a-b" + "c" against "a" + "b-c"). A value holding neither is appended
// as it is.
void AppendKeyPart(std::string& key, std::string_view value);

// Timestamps of signed requests: a decimal number of seconds (no sign), and
// whether it is within `tolerance` seconds of `now`, either way.
std::optional<std::int64_t> ParseUnixSeconds(std::string_view text);
bool WithinTolerance(std::int64_t now, std::int64_t then, std::int64_t tolerance);

// MACs and digests.
std::size_t MacSize(Algorithm algorithm);
// The raw HMAC of `data` under `key`; empty if OpenSSL fails, which then matches nothing.
std::string Hmac(Algorithm algorithm, std::string_view key, std::string_view data);
// Compares two MACs in time that depends only on their (public) length.
bool MacEquals(std::string_view expected, std::string_view sent);

// Headers and forms.
Lookup FindHeader(const std::vector<HeaderField>& headers, std::string_view name);
Lookup FindField(const Form& form, std::string_view name);
// A signature header's value, or the reason (in `problem`) there is not exactly one.
std::optional<std::string_view> SignatureHeader(const WebhookRequest& request, std::string_view name,
                                                std::string* problem);
// An id header's non-empty value, or the reason (in `problem`) there is not exactly one.
std::optional<std::string_view> IdHeader(const WebhookRequest& request, std::string_view name, std::string* problem);
// application/x-www-form-urlencoded text; nothing on a bad percent escape.
std::optional<Form> ParseForm(std::string_view text);
// The body's fields when it is declared (once) as a form and parses as one.
std::optional<Form> FormBody(const WebhookRequest& request);

// JSON, nested up to kMaxJsonDepth (common/json_limits.h) levels, as the fingerprint takes it.
std::optional<json::value> ParseJson(std::string_view text);

// The providers (SPEC §7; the rules are in providers.h).
Translation VerifyStripe(std::string_view secret, const WebhookRequest& request);
Translation VerifyGitHub(std::string_view secret, const WebhookRequest& request);
Translation VerifyTwilio(std::string_view secret, const WebhookRequest& request);
Translation VerifyTwilioEventStreams(std::string_view secret, const WebhookRequest& request);
Translation VerifyGeneric(const GenericSpec* spec, std::string_view secret, const WebhookRequest& request);
Translation VerifyStandardWebhooks(std::string_view secret, const WebhookRequest& request);

}  // namespace idemgate::webhooks::internal
