// The stored record encoding, which stores read back from disk and Redis
// where it may be corrupt. Two uses of the input:
// - as encoded bytes: DecodeRecord and PeekOwnership. Checked: they agree (a
//   record that decodes has the state and owner PeekOwnership reads, and a
//   prefix PeekOwnership refuses does not decode); a decoded record occupies
//   EncodedSize bytes and encodes back to the same bytes but for the
//   body_omitted flag, which any non-zero byte sets;
// - as the fields of a record: EncodeRecord / AppendEncodedRecord /
//   EncodeRecordInto. Checked: all three write the same EncodedSize bytes,
//   which decode to the record and peek to its state and owner; no strict
//   prefix and no longer text decodes (the encoding delimits itself).

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/record.h"
#include "fuzz_target.h"

namespace core = idemgate::core;

namespace {

// Takes fields off the front of the input; past its end, zeros and empty
// strings.
class Fields {
 public:
  explicit Fields(std::string_view in) : in_(in) {}
  std::uint8_t U8() {
    if (in_.empty()) return 0;
    const auto v = static_cast<std::uint8_t>(in_.front());
    in_.remove_prefix(1);
    return v;
  }
  std::uint64_t U64() {
    std::uint64_t v = 0;
    const std::size_t n = std::min(in_.size(), sizeof v);
    std::memcpy(&v, in_.data(), n);
    in_.remove_prefix(n);
    return v;
  }
  // A string of up to 63 bytes, or of all that is left when the length byte
  // says so (long bodies).
  std::string String() {
    const std::uint8_t length = U8();
    const std::size_t n = length == 0xff ? in_.size() : std::min<std::size_t>(length & 0x3f, in_.size());
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
 private:
  std::string_view in_;
};

// Offset of the body_omitted byte in the encoding of `r`.
std::size_t OmittedOffset(const core::Record& r) {
  return 2 + 4 + r.fingerprint.size() + 4 + r.owner.size() + 4 + r.operation_id.size() + 3 * 8 + 4;
}

void CheckEncodedBytes(std::string_view bytes) {
  const auto record = core::DecodeRecord(bytes);
  const auto ownership = core::PeekOwnership(bytes);
  if (!ownership.ok()) {
    FUZZ_CHECK(!record.ok());
    return;
  }
  // The owner is a view of the bytes.
  FUZZ_CHECK(ownership->owner.empty() ||
             (ownership->owner.data() >= bytes.data() &&
              ownership->owner.data() + ownership->owner.size() <= bytes.data() + bytes.size()));
  if (!record.ok()) return;

  FUZZ_CHECK(ownership->state == record->state);
  FUZZ_CHECK(ownership->owner == record->owner);
  FUZZ_CHECK(record->state == core::RecordState::kInFlight || record->state == core::RecordState::kCompleted);
  FUZZ_CHECK(core::EncodedSize(*record) == bytes.size());
  const std::string again = core::EncodeRecord(*record);
  FUZZ_CHECK(again.size() == bytes.size());
  const std::size_t omitted = OmittedOffset(*record);
  FUZZ_CHECK(omitted < bytes.size());
  FUZZ_CHECK((bytes[omitted] != 0) == record->response.body_omitted);
  std::string normalised(bytes);
  normalised[omitted] = record->response.body_omitted ? 1 : 0;
  FUZZ_CHECK(again == normalised);
}

void CheckRoundTrip(std::string_view input) {
  Fields f(input);
  core::Record r;
  const std::uint8_t control = f.U8();
  r.state = (control & 1) ? core::RecordState::kCompleted : core::RecordState::kInFlight;
  r.response.body_omitted = (control & 2) != 0;
  r.fingerprint = f.String();
  r.owner = f.String();
  r.operation_id = f.String();
  r.created_ms = static_cast<idemgate::UnixMillis>(f.U64());
  r.lease_expires_ms = static_cast<idemgate::UnixMillis>(f.U64());
  r.expires_ms = static_cast<idemgate::UnixMillis>(f.U64());
  r.response.status = static_cast<int>(static_cast<std::uint32_t>(f.U64()));
  for (std::size_t n = f.U8() & 0x0f; n > 0; --n) {
    std::string name = f.String();
    std::string value = f.String();
    r.response.headers.push_back({std::move(name), std::move(value)});
  }
  r.response.body = f.String();
  const std::uint8_t cut = f.U8();

  const std::string bytes = core::EncodeRecord(r);
  FUZZ_CHECK(bytes.size() == core::EncodedSize(r));
  const auto back = core::DecodeRecord(bytes);
  FUZZ_CHECK(back.ok() && *back == r);
  const auto ownership = core::PeekOwnership(bytes);
  FUZZ_CHECK(ownership.ok() && ownership->state == r.state && ownership->owner == r.owner);

  std::string appended = "prefix";
  core::AppendEncodedRecord(r, &appended);
  FUZZ_CHECK(appended == "prefix" + bytes);
  std::string block(bytes.size() + 2, '#');
  char* end = core::EncodeRecordInto(r, block.data() + 1);
  FUZZ_CHECK(end == block.data() + 1 + bytes.size());
  FUZZ_CHECK(block.front() == '#' && block.back() == '#');
  FUZZ_CHECK(block.substr(1, bytes.size()) == bytes);

  // Self-delimiting: no strict prefix decodes, nor a trailing byte more.
  // PeekOwnership needs only the prefix up to the owner.
  const std::size_t owner_end = 2 + 4 + r.fingerprint.size() + 4 + r.owner.size();
  for (const std::size_t n : {std::size_t{0}, bytes.size() - 1, cut % bytes.size(), owner_end - 1, owner_end}) {
    const std::string_view prefix = std::string_view(bytes).substr(0, n);
    FUZZ_CHECK(!core::DecodeRecord(prefix).ok());
    const auto peeked = core::PeekOwnership(prefix);
    FUZZ_CHECK(peeked.ok() == (n >= owner_end));
    if (peeked.ok()) FUZZ_CHECK(peeked->owner == r.owner);
  }
  FUZZ_CHECK(!core::DecodeRecord(bytes + std::string(1, static_cast<char>(cut))).ok());
  CheckEncodedBytes(bytes);
}

}  // namespace

IDEMGATE_FUZZ_TARGET(record) {
  const std::string_view input = idemgate::fuzz::AsView(data, size);
  CheckEncodedBytes(input);
  CheckRoundTrip(input);
  return 0;
}
