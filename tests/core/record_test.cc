#include "core/record.h"

#include "core/fingerprint.h"

#include <gtest/gtest.h>

#include <string>

namespace idemgate::core {
namespace {

Record Full() {
  Record r;
  r.state = RecordState::kCompleted;
  r.fingerprint = std::string(32, '\x01');
  r.owner = "0123456789abcdef0123456789abcdef";
  r.operation_id = "op_01HZX0000000000000000000A";
  r.created_ms = 1'700'000'000'123;
  r.lease_expires_ms = 1'700'000'035'123;
  r.expires_ms = 1'700'086'400'123;
  r.response.status = 201;
  r.response.headers = {{"Content-Type", "application/json"},
                        {"Set-Cookie", "a=1"},
                        {"Set-Cookie", "b=2"},
                        {"X-Empty", ""}};
  r.response.body = std::string("{\"id\":7}\0binary\xff", 16);
  return r;
}

TEST(RecordTest, RoundTripsCompleted) {
  const Record r = Full();
  const std::string bytes = EncodeRecord(r);
  EXPECT_EQ(bytes.size(), EncodedSize(r));
  StatusOr<Record> back = DecodeRecord(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, r);
}

// The memory store encodes straight into its entry's block: the bytes must be
// EncodeRecord's, exactly EncodedSize of them, and nothing past them touched.
TEST(RecordTest, EncodeRecordIntoWritesTheEncodingInPlace) {
  const Record r = Full();
  const std::size_t size = EncodedSize(r);
  std::string block(size + 8, '#');
  char* end = EncodeRecordInto(r, block.data() + 4);
  EXPECT_EQ(end, block.data() + 4 + size);
  EXPECT_EQ(block.substr(0, 4), "####");
  EXPECT_EQ(block.substr(4 + size), "####");
  EXPECT_EQ(block.substr(4, size), EncodeRecord(r));
}

// Records outlive the process (embedded store files, Redis): the encoding of
// a record must not change between versions.
TEST(RecordTest, EncodingIsStableAcrossVersions) {
  EXPECT_EQ(ToHex(EncodeRecord(Full())),
            "01022000000001010101010101010101010101010101010101010101010101010101010101012000000030313233343536373839616263646566303132333435363738396162636465661c0000006f705f3031485a5830303030303030303030303030303030303030417b68e5cf8b01000033f1e5cf8b0100007bc40bd58b010000c900000000040000000c000000436f6e74656e742d54797065100000006170706c69636174696f6e2f6a736f6e0a0000005365742d436f6f6b696503000000613d310a0000005365742d436f6f6b696503000000623d3207000000582d456d70747900000000100000007b226964223a377d0062696e617279ff");
}

TEST(RecordTest, RoundTripsInFlightAndOmittedBody) {
  Record r;
  r.state = RecordState::kInFlight;
  r.fingerprint = std::string(32, 'f');
  r.owner = "o";
  r.lease_expires_ms = 5;
  StatusOr<Record> back = DecodeRecord(EncodeRecord(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, r);

  Record omitted = Full();
  omitted.response.body.clear();
  omitted.response.body_omitted = true;
  back = DecodeRecord(EncodeRecord(omitted));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, omitted);
  EXPECT_TRUE(back->response.body_omitted);
}

TEST(RecordTest, EveryTruncationFails) {
  const std::string bytes = EncodeRecord(Full());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeRecord(std::string_view(bytes).substr(0, n)).ok()) << n;
  }
}

TEST(RecordTest, CorruptInputFails) {
  const std::string bytes = EncodeRecord(Full());
  std::string bad_version = bytes;
  bad_version[0] = 9;
  EXPECT_EQ(DecodeRecord(bad_version).status().code(), StatusCode::kInvalidArgument);
  std::string bad_state = bytes;
  bad_state[1] = 7;
  EXPECT_EQ(DecodeRecord(bad_state).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(DecodeRecord(bytes + "x").ok());
  // A header count far beyond the input must not allocate or read past it.
  std::string huge_count = bytes;
  std::size_t after_count = 4 + Full().response.body.size();
  for (const Header& h : Full().response.headers) after_count += 8 + h.name.size() + h.value.size();
  const std::size_t count_at = bytes.size() - after_count - 4;
  ASSERT_EQ(huge_count[count_at], static_cast<char>(Full().response.headers.size()));
  for (int i = 0; i < 4; ++i) huge_count[count_at + i] = '\xff';
  EXPECT_FALSE(DecodeRecord(huge_count).ok());
  EXPECT_FALSE(DecodeRecord("").ok());
}

TEST(RecordTest, HeaderCountIsCheckedAgainstTheBytesLeftBeforeAnythingIsAllocated) {
  // Each header needs at least 8 more bytes (two lengths). A count that the
  // rest of the record cannot hold is refused as such, instead of sizing a
  // vector of that many headers (64 bytes each) and failing on the first
  // short read: a corrupt record must not cost 64 times its size.
  const Record r = Full();
  const std::string bytes = EncodeRecord(r);
  // What follows the count: the headers, then the body with its length.
  std::size_t left = 4 + r.response.body.size();
  for (const Header& h : r.response.headers) left += 8 + h.name.size() + h.value.size();
  const std::size_t count_at = bytes.size() - left - 4;
  ASSERT_EQ(bytes[count_at], static_cast<char>(r.response.headers.size()));
  for (const std::uint32_t count : {static_cast<std::uint32_t>(left / 8 + 1), static_cast<std::uint32_t>(bytes.size())}) {
    std::string bad = bytes;
    for (int i = 0; i < 4; ++i) bad[count_at + i] = static_cast<char>((count >> (8 * i)) & 0xff);
    const auto decoded = DecodeRecord(bad);
    ASSERT_FALSE(decoded.ok()) << count;
    EXPECT_EQ(decoded.status().message(), "record: bad header count") << count;
  }
}

TEST(RecordTest, ExpiryPredicates) {
  Record r = Full();
  EXPECT_FALSE(r.ExpiredAt(r.expires_ms - 1));
  EXPECT_TRUE(r.ExpiredAt(r.expires_ms));
  r.expires_ms = 0;
  EXPECT_FALSE(r.ExpiredAt(INT64_MAX));
  r.state = RecordState::kInFlight;
  EXPECT_FALSE(r.LeaseEndedAt(r.lease_expires_ms - 1));
  EXPECT_TRUE(r.LeaseEndedAt(r.lease_expires_ms));
  r.state = RecordState::kCompleted;
  EXPECT_FALSE(r.LeaseEndedAt(r.lease_expires_ms));
}

TEST(RecordTest, PeekOwnershipReadsStateAndOwnerOfEveryPrefixThatHoldsThem) {
  Record r = Full();
  const std::string bytes = EncodeRecord(r);
  auto peek = PeekOwnership(bytes);
  ASSERT_TRUE(peek.ok()) << peek.status().ToString();
  EXPECT_EQ(peek->state, r.state);
  EXPECT_EQ(peek->owner, r.owner);
  r.state = RecordState::kInFlight;
  r.owner = "another-owner";
  const std::string other = EncodeRecord(r);  // the peeked owner views into these bytes
  peek = PeekOwnership(other);
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(peek->state, RecordState::kInFlight);
  EXPECT_EQ(peek->owner, "another-owner");
  // The prefix up to the owner is enough; anything shorter is refused.
  const std::size_t needed = 2 + 4 + Full().fingerprint.size() + 4 + Full().owner.size();
  EXPECT_TRUE(PeekOwnership(std::string_view(bytes).substr(0, needed)).ok());
  for (std::size_t n = 0; n < needed; ++n) {
    EXPECT_FALSE(PeekOwnership(std::string_view(bytes).substr(0, n)).ok()) << n;
  }
  std::string bad_version = bytes;
  bad_version[0] = 9;
  EXPECT_FALSE(PeekOwnership(bad_version).ok());
  std::string bad_state = bytes;
  bad_state[1] = 7;
  EXPECT_FALSE(PeekOwnership(bad_state).ok());
}

}  // namespace
}  // namespace idemgate::core
