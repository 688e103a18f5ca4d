#pragma once

#include <string>
#include <vector>

#include "config/config.h"

// What a reload changes about records already stored: a stored key is made of
// the caller's scope, the route id and the client's key, and a replay also
// needs the request's fingerprint to match. A reload that renames or removes
// a route, changes the scope its keys are made under, or changes what its
// fingerprint covers leaves the records stored before where retries no longer
// find them (they run again) or no longer match them (422). The gateway takes
// such a reload (it may be meant) and logs each of these as a warning.
namespace idemgate::config {

// One line per route or webhook endpoint of `before` whose stored records
// `after` no longer reaches, in `before`'s order; empty when none. Routes
// whose records the gateway does not keep (policy passthrough or prohibited,
// dedup: upstream) are not looked at. Pure.
std::vector<std::string> StoredKeyChanges(const Config& before, const Config& after);

}  // namespace idemgate::config
