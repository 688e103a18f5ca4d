#pragma once

#include <string>

#include "common/clock.h"
#include "core/record.h"

namespace idemgate::store::redis::testing {

inline std::string Fingerprint(char seed) { return std::string(32, seed); }

inline core::Record InFlight(std::string owner, std::string fingerprint, UnixMillis now,
                             std::int64_t lease_ms = 30'000) {
  core::Record r;
  r.state = core::RecordState::kInFlight;
  r.fingerprint = std::move(fingerprint);
  r.owner = std::move(owner);
  r.operation_id = "op-" + r.owner;
  r.created_ms = now;
  r.lease_expires_ms = now + lease_ms;
  return r;
}

inline core::Record CompletedFrom(const core::Record& reservation, UnixMillis now, std::int64_t retention_ms,
                                  std::string body = "{\"ok\":true}") {
  core::Record r = reservation;
  r.state = core::RecordState::kCompleted;
  r.lease_expires_ms = 0;
  r.expires_ms = retention_ms == 0 ? 0 : now + retention_ms;
  r.response.status = 201;
  r.response.headers = {{"Content-Type", "application/json"}, {"Set-Cookie", "a=1"}, {"Set-Cookie", "b=2"}};
  r.response.body = std::move(body);
  return r;
}

}  // namespace idemgate::store::redis::testing
