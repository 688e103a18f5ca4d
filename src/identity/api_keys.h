#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "core/scope.h"

// identity.mode api_key (SPEC §6): the keys file.
namespace idemgate::identity {

// Parses an API keys file (YAML):
//   keys:
//     - { sha256: <64 hex digits of the key's SHA-256>, tenant: acme, project: shop, subject: "service:billing" }
// into callers by lower-case hex SHA-256. `source` names the file in
// messages; InvalidArgument naming the entry and key on any problem (an
// unknown key, a bad hash, a component that is not 1..256 visible
// characters, a hash listed twice). Pure.
StatusOr<std::unordered_map<std::string, core::Caller>> ParseApiKeys(std::string_view yaml, const std::string& source);

}  // namespace idemgate::identity
