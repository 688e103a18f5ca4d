#include "core/record.h"

#include <bit>
#include <cassert>
#include <cstring>

namespace idemgate::core {
namespace {

constexpr std::uint8_t kVersion = 1;

// Writes into a buffer sized beforehand (EncodedSize): no capacity checks
// or appends per field.
class Writer {
 public:
  explicit Writer(char* at) : at_(at) {}
  void U8(std::uint8_t v) { *at_++ = static_cast<char>(v); }
  void U32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) *at_++ = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void U64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) *at_++ = static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void Bytes(std::string_view s) {
    U32(static_cast<std::uint32_t>(s.size()));
    if (!s.empty()) std::memcpy(at_, s.data(), s.size());
    at_ += s.size();
  }
  char* at() { return at_; }

 private:
  char* at_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool U8(std::uint8_t* v) {
    if (in_.size() < 1) return false;
    *v = static_cast<std::uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool U32(std::uint32_t* v) { return Little(v); }
  bool U64(std::uint64_t* v) { return Little(v); }
  bool Bytes(std::string* s) {
    std::uint32_t n = 0;
    if (!U32(&n) || in_.size() < n) return false;
    *s = std::string(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }
  std::size_t remaining() const { return in_.size(); }

 private:
  // A little-endian unsigned integer of sizeof(T) bytes.
  template <typename T>
  bool Little(T* v) {
    if (in_.size() < sizeof(T)) return false;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(v, in_.data(), sizeof(T));
    } else {
      *v = 0;
      for (std::size_t i = 0; i < sizeof(T); ++i) *v |= static_cast<T>(static_cast<std::uint8_t>(in_[i])) << (8 * i);
    }
    in_.remove_prefix(sizeof(T));
    return true;
  }

  std::string_view in_;
};

}  // namespace

StatusOr<RecordOwnership> PeekOwnership(std::string_view bytes) {
  // version (1), state (1), fingerprint (u32 length + bytes), owner (u32 length + bytes)
  auto u32 = [&bytes](std::size_t at, std::uint32_t* v) {
    if (bytes.size() < at + 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(bytes[at + i])) << (8 * i);
    return true;
  };
  if (bytes.size() < 2 || static_cast<std::uint8_t>(bytes[0]) != kVersion) {
    return InvalidArgumentError("record: unknown version or truncated");
  }
  const auto state = static_cast<std::uint8_t>(bytes[1]);
  if (state != static_cast<std::uint8_t>(RecordState::kInFlight) &&
      state != static_cast<std::uint8_t>(RecordState::kCompleted)) {
    return InvalidArgumentError("record: bad state");
  }
  std::uint32_t fp_len = 0, owner_len = 0;
  if (!u32(2, &fp_len) || !u32(6 + fp_len, &owner_len) || bytes.size() < 10 + std::size_t{fp_len} + owner_len) {
    return InvalidArgumentError("record: truncated");
  }
  return RecordOwnership{static_cast<RecordState>(state), bytes.substr(10 + fp_len, owner_len)};
}

std::string EncodeRecord(const Record& r) {
  std::string out;
  AppendEncodedRecord(r, &out);
  return out;
}

void AppendEncodedRecord(const Record& r, std::string* out) {
  const std::size_t start = out->size();
  out->resize(start + EncodedSize(r));
  EncodeRecordInto(r, out->data() + start);
}

char* EncodeRecordInto(const Record& r, char* out) {
  Writer w(out);
  w.U8(kVersion);
  w.U8(static_cast<std::uint8_t>(r.state));
  w.Bytes(r.fingerprint);
  w.Bytes(r.owner);
  w.Bytes(r.operation_id);
  w.U64(static_cast<std::uint64_t>(r.created_ms));
  w.U64(static_cast<std::uint64_t>(r.lease_expires_ms));
  w.U64(static_cast<std::uint64_t>(r.expires_ms));
  w.U32(static_cast<std::uint32_t>(r.response.status));
  w.U8(r.response.body_omitted ? 1 : 0);
  w.U32(static_cast<std::uint32_t>(r.response.headers.size()));
  for (const Header& h : r.response.headers) {
    w.Bytes(h.name);
    w.Bytes(h.value);
  }
  w.Bytes(r.response.body);
  assert(w.at() == out + EncodedSize(r));
  return w.at();
}

std::size_t EncodedSize(const Record& r) {
  std::size_t n = 2 + 4 * 3 + r.fingerprint.size() + r.owner.size() + r.operation_id.size() +
                  8 * 3 + 4 + 1 + 4 + 4 + r.response.body.size();
  for (const Header& h : r.response.headers) n += 8 + h.name.size() + h.value.size();
  return n;
}

StatusOr<Record> DecodeRecord(std::string_view bytes) {
  Reader in(bytes);
  Record r;
  std::uint8_t version = 0, state = 0, omitted = 0;
  std::uint64_t created = 0, lease = 0, expires = 0;
  std::uint32_t status = 0, nheaders = 0;
  if (!in.U8(&version)) return InvalidArgumentError("record: empty");
  if (version != kVersion) return InvalidArgumentError("record: unknown version " + std::to_string(version));
  if (!in.U8(&state) || (state != 1 && state != 2)) return InvalidArgumentError("record: bad state");
  r.state = static_cast<RecordState>(state);
  if (!in.Bytes(&r.fingerprint) || !in.Bytes(&r.owner) || !in.Bytes(&r.operation_id) ||
      !in.U64(&created) || !in.U64(&lease) || !in.U64(&expires) || !in.U32(&status) ||
      !in.U8(&omitted) || !in.U32(&nheaders)) {
    return InvalidArgumentError("record: truncated");
  }
  r.created_ms = static_cast<UnixMillis>(created);
  r.lease_expires_ms = static_cast<UnixMillis>(lease);
  r.expires_ms = static_cast<UnixMillis>(expires);
  r.response.status = static_cast<int>(status);
  r.response.body_omitted = omitted != 0;
  // Each header takes at least its two 4-byte lengths: a corrupt count is
  // refused before it sizes the vector (64 bytes of Header per count).
  if (nheaders > in.remaining() / 8) return InvalidArgumentError("record: bad header count");
  r.response.headers.resize(nheaders);
  for (Header& h : r.response.headers) {
    if (!in.Bytes(&h.name) || !in.Bytes(&h.value)) return InvalidArgumentError("record: truncated header");
  }
  if (!in.Bytes(&r.response.body)) return InvalidArgumentError("record: truncated body");
  if (!in.done()) return InvalidArgumentError("record: trailing bytes");
  return r;
}

}  // namespace idemgate::core
