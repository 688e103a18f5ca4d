#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/hex.h"
#include "common/status.h"

namespace idemgate::core {

// How a JSON body enters the fingerprint (core's own enum; the gateway maps
// config::JsonMode onto it).
enum class JsonMode {
  kCanonical,  // JSON bodies: parsed and re-serialised canonically
  kRaw,        // the body's bytes as sent
};

// What the fingerprint covers (SPEC §3.2).
struct FingerprintRules {
  // Request headers included, by name (matched case-insensitively).
  std::vector<std::string> headers = {"content-type"};
  JsonMode json = JsonMode::kCanonical;
  // JSON Pointers (RFC 6901). When non-empty and the body is JSON, only
  // these fields of the body count (in this order), in either json mode.
  std::vector<std::string> json_fields;
};

struct HeaderView {
  std::string_view name;
  std::string_view value;
};

// The parts of a request the fingerprint is taken over. Views only; the
// caller keeps the data alive for the call.
struct FingerprintRequest {
  std::string_view method;    // as sent (methods are case-sensitive)
  std::string_view route_id;
  std::string_view target;    // path and query, as sent
  std::vector<HeaderView> headers;  // every request header, in order
  std::string_view body;
};

// SHA-256 (32 raw bytes) over method, route id, target, the selected headers
// (each line's value as sent; an absent header differs from an empty one;
// repeated lines count in order) and the body:
//  - JSON body (Content-Type application/json or */*+json) that parses, with
//    json_fields: the canonical form of each field, or "absent";
//  - JSON body that parses, json mode canonical: CanonicalJson(body);
//  - otherwise (including JSON that does not parse): the raw bytes.
// Every component is length-prefixed and the body part tagged with its kind,
// so no two different requests collide by concatenation. Pure; thread-safe.
std::string ComputeFingerprint(const FingerprintRequest& request, const FingerprintRules& rules);

// True for application/json and any type/subtype ending in "+json",
// case-insensitively, ignoring parameters.
bool IsJsonContentType(std::string_view content_type);

// The canonical form of a JSON text: no white space; object members sorted
// by key (byte order of the UTF-8 key, i.e. code point order), a repeated key
// keeping its last value (as most JSON readers do); strings with escapes
// decoded, written with only '"', '\' and control characters escaped
// (\u00XX); numbers in their canonical form (CanonicalJsonNumber). Fails with
// InvalidArgument when `json` is not one valid JSON text (RFC 8259, UTF-8,
// nesting ≤ 64).
StatusOr<std::string> CanonicalJson(std::string_view json);

// The canonical spelling of a valid JSON number, equal for equal values:
// 1, 1.0, 1e0 and 10e-1 are all "1"; -0 is "0". An integer of at most 21
// digits is written plainly; any other value as <significand>e<exponent>
// with an integer significand without leading or trailing zeros: 1.5 is
// "15e-1", 1e30 is "1e30", -0.0025 is "-25e-4". Exact (no rounding through
// double). An exponent with more than 15 digits keeps the literal text.
std::string CanonicalJsonNumber(std::string_view number);

// The fields of a JSON document at `pointers` (RFC 6901, incl. ~0 and ~1),
// each canonical, or nullopt when absent (a JSON null is "null"). An invalid
// pointer selects nothing. InvalidArgument when `json` does not parse.
StatusOr<std::vector<std::optional<std::string>>> CanonicalJsonFields(
    std::string_view json, const std::vector<std::string>& pointers);

// True for "" and for "/"-separated tokens whose '~' are all ~0 or ~1.
bool IsValidJsonPointer(std::string_view pointer);

}  // namespace idemgate::core
