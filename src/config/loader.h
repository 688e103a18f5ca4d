#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "config/config.h"

// The strict YAML loader for the gateway's config (SPEC §11, documented key by
// key in docs/configuration.md). Every mapping checks its keys: an unknown or
// duplicate key, a value of the wrong type or out of range, or a broken
// cross-reference is an error. Route-level `idempotency` keys override
// `defaults.idempotency` key by key (the `fingerprint` and `key` sub-maps too).
//
// On success the Config is normalised and has passed Validate() (validate.h):
// source set, Route::line set, upstream URLs split into scheme/host/port/
// base_path, methods upper-case, fingerprint header names lower-case.
//
// On failure the Status is InvalidArgument (NotFound when the file does not
// exist) and its message is self-contained, for printing as is:
//   "quickstart.yaml:12: routes[0].idempotency.retention: invalid duration "1x" (...)"
// i.e. "<source>:<line>: <key path>: <what is wrong>"; YAML syntax errors read
// "<source>:<line>: YAML syntax error: ...". Only the first problem is reported.
//
// Both functions are pure (no global state) and safe to call from any thread.
namespace idemgate::config {

// Reads and loads the file at `path`; `path` as given becomes Config::source
// and the prefix of every message.
StatusOr<Config> LoadFile(const std::string& path);

// Loads YAML text; `source_name` is used as Config::source and in messages.
StatusOr<Config> LoadString(std::string_view yaml, std::string source_name);

}  // namespace idemgate::config
