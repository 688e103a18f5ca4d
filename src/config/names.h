#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "config/config.h"

// The spelling of every config enum in YAML, logs and messages (SPEC §11).
// Name(value) and FromName<E>(text) are exact inverses; matching is
// case-sensitive, as the file format is.
namespace idemgate::config {

template <typename E>
struct EnumNames;

template <>
struct EnumNames<Policy> {
  static constexpr std::pair<Policy, std::string_view> kNames[] = {
      {Policy::kRequired, "required"},     {Policy::kOptional, "optional"},
      {Policy::kWebhook, "webhook"},       {Policy::kPassthrough, "passthrough"},
      {Policy::kProhibited, "prohibited"},
  };
};

template <>
struct EnumNames<Scope> {
  static constexpr std::pair<Scope, std::string_view> kNames[] = {
      {Scope::kSubject, "subject"},
      {Scope::kProject, "project"},
      {Scope::kTenant, "tenant"},
      {Scope::kGlobal, "global"},
  };
};

template <>
struct EnumNames<InFlightMode> {
  static constexpr std::pair<InFlightMode, std::string_view> kNames[] = {
      {InFlightMode::kReject, "reject"},
      {InFlightMode::kWait, "wait"},
  };
};

template <>
struct EnumNames<JsonMode> {
  static constexpr std::pair<JsonMode, std::string_view> kNames[] = {
      {JsonMode::kCanonical, "canonical"},
      {JsonMode::kRaw, "raw"},
  };
};

template <>
struct EnumNames<DedupMode> {
  static constexpr std::pair<DedupMode, std::string_view> kNames[] = {
      {DedupMode::kGateway, "gateway"},
      {DedupMode::kUpstream, "upstream"},
  };
};

template <>
struct EnumNames<ForwardKey> {
  static constexpr std::pair<ForwardKey, std::string_view> kNames[] = {
      {ForwardKey::kNamespaced, "namespaced"},
      {ForwardKey::kRaw, "raw"},
      {ForwardKey::kNone, "none"},
  };
};

template <>
struct EnumNames<StoreKind> {
  static constexpr std::pair<StoreKind, std::string_view> kNames[] = {
      {StoreKind::kEmbedded, "embedded"},
      {StoreKind::kMemory, "memory"},
      {StoreKind::kRedis, "redis"},
  };
};

template <>
struct EnumNames<OnError> {
  static constexpr std::pair<OnError, std::string_view> kNames[] = {
      {OnError::kFailClosed, "fail_closed"},
      {OnError::kFailOpen, "fail_open"},
  };
};

template <>
struct EnumNames<IdentityMode> {
  static constexpr std::pair<IdentityMode, std::string_view> kNames[] = {
      {IdentityMode::kNone, "none"},
      {IdentityMode::kTrustedHeaders, "trusted_headers"},
      {IdentityMode::kJwt, "jwt"},
      {IdentityMode::kApiKey, "api_key"},
  };
};

// The YAML spelling of `value` ("fail_closed", "webhook", ...).
template <typename E>
constexpr std::string_view Name(E value) {
  for (const auto& [e, name] : EnumNames<E>::kNames) {
    if (e == value) return name;
  }
  return "unknown";
}

// The value spelled `name`, or nullopt.
template <typename E>
constexpr std::optional<E> FromName(std::string_view name) {
  for (const auto& [e, n] : EnumNames<E>::kNames) {
    if (n == name) return e;
  }
  return std::nullopt;
}

// Every spelling, "a|b|c", for error messages.
template <typename E>
std::string AllowedNames() {
  std::string out;
  for (const auto& entry : EnumNames<E>::kNames) {
    if (!out.empty()) out += '|';
    out += entry.second;
  }
  return out;
}

// JWT signature algorithms of identity.mode jwt (SPEC §6).
inline constexpr std::string_view kJwtAlgorithms[] = {"RS256", "ES256", "HS256"};

// The types of a subject (SPEC §6): "<type>:<id>".
inline constexpr std::string_view kSubjectTypes[] = {"user", "service", "tenant_member", "client"};

// The path segment of a webhook route that names the endpoint (SPEC §7).
inline constexpr std::string_view kWebhookIdPlaceholder = "{webhook_id}";

// Webhook providers known to the gateway (SPEC §7), for `provider` keys.
inline constexpr std::string_view kWebhookProviders[] = {
    "stripe", "github", "twilio", "twilio_event_streams", "generic", "standard_webhooks",
};

// Log levels and formats accepted in `log` (SPEC §11).
inline constexpr std::string_view kLogLevels[] = {"debug", "info", "warn", "error"};
inline constexpr std::string_view kLogFormats[] = {"json", "text"};

}  // namespace idemgate::config
