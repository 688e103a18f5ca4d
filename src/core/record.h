#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace idemgate::core {

struct Header {
  std::string name;
  std::string value;
  friend bool operator==(const Header&, const Header&) = default;
};

// A final upstream response as stored and replayed (SPEC §4.3, §4.4).
struct StoredResponse {
  int status = 0;
  std::vector<Header> headers;  // original order; repeated names (Set-Cookie) kept
  std::string body;             // empty when body_omitted
  bool body_omitted = false;    // the original exceeded max_response_bytes
  friend bool operator==(const StoredResponse&, const StoredResponse&) = default;

  // Drops a non-empty body (its memory too), keeping status and headers, as
  // for one past max_response_bytes: replays answer `Idempotency-Replay:
  // omitted`. Returns the bytes dropped (0: nothing changed).
  std::uint64_t DropBody() {
    const std::uint64_t dropped = body.size();
    if (dropped == 0) return 0;
    body.clear();
    body.shrink_to_fit();
    body_omitted = true;
    return dropped;
  }
};

enum class RecordState : std::uint8_t { kInFlight = 1, kCompleted = 2 };

// What a store keeps under one scoped key. An in-flight record is a
// reservation held by `owner` until `lease_expires_ms`; a completed record
// holds the response until `expires_ms` (0: until purged).
struct Record {
  RecordState state = RecordState::kInFlight;
  std::string fingerprint;  // raw SHA-256 digest of the request (32 bytes)
  std::string owner;        // owner token of the reservation; kept after completion
  std::string operation_id; // X-Operation-Id handed to the first request
  UnixMillis created_ms = 0;
  UnixMillis lease_expires_ms = 0;  // in flight only
  UnixMillis expires_ms = 0;        // retention end; 0: never
  StoredResponse response;          // completed only
  friend bool operator==(const Record&, const Record&) = default;

  // True when a completed record is past its retention at `now`.
  bool ExpiredAt(UnixMillis now) const { return expires_ms != 0 && expires_ms <= now; }
  // True when an in-flight record's lease has ended at `now`.
  bool LeaseEndedAt(UnixMillis now) const {
    return state == RecordState::kInFlight && lease_expires_ms <= now;
  }
};

// Versioned, self-delimiting binary encoding shared by every persistent store.
std::string EncodeRecord(const Record& record);
// Appends EncodeRecord(record) to `out`, without a string of its own.
void AppendEncodedRecord(const Record& record, std::string* out);
// Writes EncodeRecord(record) to the EncodedSize(record) bytes at `out`;
// returns the end of what it wrote.
char* EncodeRecordInto(const Record& record, char* out);
// Fails with InvalidArgument on truncated, corrupt or unknown-version input.
StatusOr<Record> DecodeRecord(std::string_view bytes);
// The state and owner of an encoded record, read without decoding the rest
// (for compare-and-set on the owner). `owner` views into `bytes`.
struct RecordOwnership {
  RecordState state = RecordState::kInFlight;
  std::string_view owner;
};
// Fails like DecodeRecord on a truncated or unknown-version prefix.
StatusOr<RecordOwnership> PeekOwnership(std::string_view bytes);

// Bytes a record occupies once encoded, for store accounting.
std::size_t EncodedSize(const Record& record);

}  // namespace idemgate::core
