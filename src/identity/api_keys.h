#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "core/scope.h"

// identity.mode api_key (SPEC §6): the keys file.
namespace idemgate::identity {

// Parses an API keys file (YAML, one document):
//   keys:
//     - { sha256: <64 hex digits of the key's SHA-256>, tenant: acme, project: shop, subject: "service:billing" }
// into callers by lower-case hex SHA-256; an entry may also have a `name`, a
// label that is not used. As strict as the config loader (config/loader.h):
// InvalidArgument on any problem (a YAML syntax error, an unknown key, a key
// written twice in one mapping, a bad hash, a component that is not 1..256
// visible characters, a hash listed twice), reading
// "<source>:<line>: keys[<i>].<key>: <what is wrong>". Pure.
StatusOr<std::unordered_map<std::string, core::Caller>> ParseApiKeys(std::string_view yaml, const std::string& source);

}  // namespace idemgate::identity
