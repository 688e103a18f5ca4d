#include "core/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <boost/json/basic_parser_impl.hpp>
#include <cstdint>
#include <cstring>
#include <array>
#include <bit>
#include <charconv>
#include <limits>
#include <memory>
#include <memory_resource>

#include "common/ascii.h"
#include "common/json_limits.h"

namespace idemgate::core {

namespace {

namespace json = boost::json;

constexpr std::size_t kNoIndex = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kMaxPlainIntegerDigits = 21;
constexpr std::size_t kMaxExponentDigits = 15;

template <typename Output>
void AppendCanonicalJsonNumber(Output* out, std::string_view number);


// True when one of the 8 bytes at `p` is a control character, '"' or '\\'
// (the bytes JSON strings escape). Exact: a byte-wise test of "some byte is
// below 0x20" and "some byte is zero" on the word, never a false answer.
bool NeedsEscapeIn8(const char* p) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL;
  constexpr std::uint64_t kHigh = 0x8080808080808080ULL;
  std::uint64_t w;
  std::memcpy(&w, p, sizeof w);
  const auto has_zero = [](std::uint64_t x) { return ((x - kOnes) & ~x & kHigh) != 0; };
  const bool control = ((w - kOnes * 0x20) & ~w & kHigh) != 0;
  return control || has_zero(w ^ (kOnes * '"')) || has_zero(w ^ (kOnes * '\\'));
}

bool NeedsEscape(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u < 0x20 || u == '"' || u == '\\';
}

// Appends `s` as a JSON string: quoted, with '"', '\\' and control
// characters escaped and everything else (UTF-8 included) as it is.
template <typename String>
void AppendQuoted(String* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const std::size_t n = s.size();
  std::size_t i = 0;
  // The usual case, nothing to escape: found eight bytes at a time, then
  // written with its quotes in one step.
  while (i + 8 <= n && !NeedsEscapeIn8(s.data() + i)) i += 8;
  while (i < n && !NeedsEscape(s[i])) ++i;
  if (i == n) {
    const std::size_t at = out->size();
    out->resize(at + n + 2);
    char* p = out->data() + at;
    p[0] = '"';
    if (n != 0) std::memcpy(p + 1, s.data(), n);
    p[n + 1] = '"';
    return;
  }
  out->reserve(out->size() + n + 8);
  out->push_back('"');
  std::size_t run = 0;  // start of the characters not yet written, none of which needs escaping
  while (i < n) {
    const auto u = static_cast<unsigned char>(s[i]);
    out->append(s.data() + run, i - run);
    if (u >= 0x20) {
      out->push_back('\\');
      out->push_back(s[i]);
    } else {
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 0xf]);
    }
    run = ++i;
    while (i + 8 <= n && !NeedsEscapeIn8(s.data() + i)) i += 8;
    while (i < n && !NeedsEscape(s[i])) ++i;
  }
  out->append(s.data() + run, n - run);
  out->push_back('"');
}

// The canonical text as it is written: a growing byte buffer whose appends
// are inline and never zero-fill (std::string's push_back is an out-of-line
// call in libstdc++, and its resize writes every new byte twice). Memory
// comes from the canonicaliser's scratch resource.
class OutputBuffer {
 public:
  explicit OutputBuffer(std::pmr::memory_resource* mr) : mr_(mr) {}
  OutputBuffer(const OutputBuffer&) = delete;
  OutputBuffer& operator=(const OutputBuffer&) = delete;
  ~OutputBuffer() {
    if (data_ != nullptr) mr_->deallocate(data_, capacity_, kAlignment);
  }

  std::size_t size() const { return size_; }
  char* data() { return data_; }
  std::string_view view() const { return {data_, size_}; }

  void reserve(std::size_t n) {
    if (n > capacity_) Reallocate(n);
  }
  // Sets the size; new bytes are left for the caller to write.
  void resize(std::size_t n) {
    reserve(n);
    size_ = n;
  }
  void push_back(char c) {
    if (size_ == capacity_) Grow(1);
    data_[size_++] = c;
  }
  void append(const char* p, std::size_t n) {
    if (capacity_ - size_ < n) Grow(n);
    if (n != 0) std::memcpy(data_ + size_, p, n);
    size_ += n;
  }
  void append(std::string_view s) { append(s.data(), s.size()); }
  void append(std::size_t count, char c) {
    if (capacity_ - size_ < count) Grow(count);
    std::memset(data_ + size_, c, count);
    size_ += count;
  }

 private:
  void Grow(std::size_t more) { Reallocate(std::max(size_ + more, capacity_ * 2 + 16)); }
  void Reallocate(std::size_t capacity) {
    char* fresh = static_cast<char*>(mr_->allocate(capacity, kAlignment));
    if (size_ != 0) std::memcpy(fresh, data_, size_);
    if (data_ != nullptr) mr_->deallocate(data_, capacity_, kAlignment);
    data_ = fresh;
    capacity_ = capacity;
  }

  // The heap's own alignment: smaller ones reach operator new with an
  // explicit alignment, which sanitizers report as mismatched on delete.
  static constexpr std::size_t kAlignment = alignof(std::max_align_t);

  std::pmr::memory_resource* mr_;
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

// A JSON Pointer split into unescaped tokens; `indices[i]` is the token as an
// array index, or kNoIndex when it is not one ("-" and "01" are not).
struct ParsedPointer {
  bool valid = false;
  std::vector<std::string> tokens;
  std::vector<std::size_t> indices;
};

ParsedPointer ParsePointer(std::string_view pointer) {
  ParsedPointer p;
  if (pointer.empty()) {
    p.valid = true;
    return p;
  }
  if (pointer.front() != '/') return p;
  std::size_t pos = 1;
  while (true) {
    const std::size_t end = std::min(pointer.find('/', pos), pointer.size());
    std::string token;
    for (std::size_t i = pos; i < end; ++i) {
      if (pointer[i] != '~') {
        token.push_back(pointer[i]);
        continue;
      }
      if (i + 1 >= end || (pointer[i + 1] != '0' && pointer[i + 1] != '1')) return ParsedPointer{};
      token.push_back(pointer[i + 1] == '0' ? '~' : '/');
      ++i;
    }
    std::size_t index = kNoIndex;
    const bool digits = !token.empty() && std::all_of(token.begin(), token.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (digits && (token.size() == 1 || token.front() != '0') && token.size() <= 18) {
      index = std::stoull(token);
    }
    p.tokens.push_back(std::move(token));
    p.indices.push_back(index);
    if (end == pointer.size()) break;
    pos = end + 1;
  }
  p.valid = true;
  return p;
}

// A boost::json::basic_parser handler that writes the canonical form of the
// document into one string as the parser goes. Scalars are written once, in
// place. An object's members are written in document order, each remembered
// as a range of the output with its raw key; when the object closes and its
// keys are not already strictly ascending, only that object's text is
// rebuilt in key order (repeated keys keep the last). So a document whose
// objects are already sorted is never copied, and an unsorted object costs
// one copy of its own text. With `pointers`, it also keeps the canonical text
// of every value found at one of them.
//
// The bookkeeping (frames, members, keys) comes from one memory resource:
// for bodies of usual size a buffer on the caller's stack, so a canonical
// form costs no heap allocation but the result.
class CanonicalHandler {
 public:
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t kFramesReserved = 8;
  static constexpr std::size_t kMembersReserved = 16;
  static constexpr std::size_t kOutputSlack = 64;
  static constexpr std::size_t kKeysReserved = 1024;

  CanonicalHandler(const std::vector<ParsedPointer>* pointers, std::pmr::memory_resource* mr, std::string_view input)
      : pointers_(pointers),
        input_begin_(reinterpret_cast<std::uintptr_t>(input.data())),
        input_end_(input_begin_ + input.size()),
        frames_(mr),
        members_(mr),
        keys_(mr),
        part_(mr),
        order_(mr),
        out_(mr) {
    if (pointers_ != nullptr) captures_.resize(pointers_->size());
    frames_.reserve(kFramesReserved);
    members_.reserve(kMembersReserved);
    keys_.reserve(std::min(input.size(), kKeysReserved));
    out_.reserve(input.size() + kOutputSlack);
  }

  bool on_document_begin(json::error_code&) { return true; }
  bool on_document_end(json::error_code&) { return true; }

  bool on_array_begin(json::error_code&) {
    const std::size_t start = BeginValue();
    frames_.push_back(Frame{.start = start});
    out_.push_back('[');
    return true;
  }
  bool on_array_end(std::size_t, json::error_code&) {
    const std::size_t start = frames_.back().start;
    frames_.pop_back();
    out_.push_back(']');
    EndValue(start);
    return true;
  }

  bool on_object_begin(json::error_code&) {
    const std::size_t start = BeginValue();
    frames_.push_back(Frame{.start = start, .is_object = true, .first_member = members_.size(), .keys_mark = keys_.size()});
    out_.push_back('{');
    return true;
  }
  bool on_object_end(std::size_t, json::error_code&) {
    const Frame frame = frames_.back();
    frames_.pop_back();
    bool ascending = true;
    for (std::size_t i = frame.first_member + 1; i < members_.size() && ascending; ++i) {
      ascending = KeyOf(members_[i - 1]) < KeyOf(members_[i]);
    }
    if (!ascending) Reorder(frame);
    members_.resize(frame.first_member);
    keys_.resize(frame.keys_mark);
    out_.push_back('}');
    EndValue(frame.start);
    return true;
  }

  bool on_string_part(json::string_view s, std::size_t, json::error_code&) {
    part_.append(s.data(), s.size());
    return true;
  }
  bool on_string(json::string_view s, std::size_t, json::error_code&) {
    const std::size_t start = BeginValue();
    const bool as_it_came = AsItCame(s);
    Quote(Whole(s), as_it_came);
    part_.clear();
    EndValue(start);
    return true;
  }

  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    part_.append(s.data(), s.size());
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code&) {
    Frame& top = frames_.back();
    const bool as_it_came = AsItCame(s);
    const std::string_view key = Whole(s);
    if (top.count > 0) out_.push_back(',');
    top.key_offset = keys_.size();
    top.key_size = key.size();
    keys_.append(key);
    members_.push_back(Member{.key_offset = top.key_offset, .key_size = key.size(), .begin = out_.size()});
    Quote(key, as_it_came);
    out_.push_back(':');
    part_.clear();
    return true;
  }

  bool on_number_part(json::string_view s, json::error_code&) {
    part_.append(s.data(), s.size());
    return true;
  }
  bool on_int64(std::int64_t, json::string_view s, json::error_code&) { return Number(s); }
  bool on_uint64(std::uint64_t, json::string_view s, json::error_code&) { return Number(s); }
  bool on_double(double, json::string_view s, json::error_code&) { return Number(s); }

  bool on_bool(bool b, json::error_code&) { return Literal(b ? "true" : "false"); }
  bool on_null(json::error_code&) { return Literal("null"); }
  bool on_comment_part(json::string_view, json::error_code&) { return true; }
  bool on_comment(json::string_view, json::error_code&) { return true; }

  // The canonical text, once the document is complete.
  std::string_view output() const { return out_.view(); }
  std::vector<std::optional<std::string>>& captures() { return captures_; }

 private:
  struct Frame {
    std::size_t start = 0;  // offset of '[' or '{' in out_
    bool is_object = false;
    std::size_t count = 0;         // values (array) or members (object) so far
    std::size_t first_member = 0;  // object: its first entry in members_
    std::size_t keys_mark = 0;     // object: keys_ size when it opened
    std::size_t key_offset = 0;    // object: raw key of the member being parsed, in keys_
    std::size_t key_size = 0;
  };
  // One object member: its raw key (in keys_) and its text `"key":value` in out_.
  struct Member {
    std::size_t key_offset = 0;
    std::size_t key_size = 0;
    std::size_t begin = 0;
    std::size_t end = 0;
  };

  std::string_view KeyOf(const Member& m) const { return std::string_view(keys_).substr(m.key_offset, m.key_size); }
  std::string_view KeyOf(const Frame& f) const { return std::string_view(keys_).substr(f.key_offset, f.key_size); }

  // Rewrites the members of the object opened at `frame` in key order,
  // stable, keeping only the last of repeated keys.
  void Reorder(const Frame& frame) {
    const std::size_t n = members_.size() - frame.first_member;
    const Member* members = members_.data() + frame.first_member;
    order_.clear();
    for (std::size_t i = 0; i < n; ++i) order_.push_back(i);
    std::sort(order_.begin(), order_.end(), [this, members](std::size_t a, std::size_t b) {
      const int c = KeyOf(members[a]).compare(KeyOf(members[b]));
      return c != 0 ? c < 0 : a < b;
    });
    // The members are written in order behind the object's text, which is
    // then replaced by them. The reordered text is never longer than the
    // original, so reserving that much up front keeps every source range in
    // place while it is copied.
    const std::size_t body = frame.start + 1;
    const std::size_t end = out_.size();
    out_.reserve(end + (end - body));
    for (std::size_t k = 0; k < n; ++k) {
      const Member& m = members[order_[k]];
      if (k + 1 < n && KeyOf(members[order_[k + 1]]) == KeyOf(m)) continue;
      if (out_.size() != end) out_.push_back(',');
      out_.append(out_.data() + m.begin, m.end - m.begin);
    }
    const std::size_t rebuilt = out_.size() - end;
    std::memmove(out_.data() + body, out_.data() + end, rebuilt);
    out_.resize(body + rebuilt);
  }

  // True when the string or key whose last piece is `s` is a view of the
  // input: it came in one piece with no escape sequence, and JSON's grammar
  // keeps '"', '\\' and control characters out of such a string, so its
  // bytes can be written as they are, without the search for characters to
  // escape.
  bool AsItCame(json::string_view s) const {
    const auto at = reinterpret_cast<std::uintptr_t>(s.data());
    return part_.empty() && at >= input_begin_ && at + s.size() <= input_end_;
  }
  void Quote(std::string_view s, bool as_it_came) {
    if (!as_it_came) {
      AppendQuoted(&out_, s);
      return;
    }
    out_.reserve(out_.size() + s.size() + 2);
    out_.push_back('"');
    out_.append(s.data(), s.size());
    out_.push_back('"');
  }

  // The string, key or number whose last piece is `s`: `s` itself when it
  // came in one piece (the usual case, no copy), else the pieces gathered in
  // part_. The caller clears part_ once it is done with the view.
  std::string_view Whole(json::string_view s) {
    if (part_.empty()) return {s.data(), s.size()};
    part_.append(s.data(), s.size());
    return part_;
  }

  bool Number(json::string_view s) {
    const std::size_t start = BeginValue();
    AppendCanonicalJsonNumber(&out_, Whole(s));
    part_.clear();
    EndValue(start);
    return true;
  }

  bool Literal(std::string_view text) {
    const std::size_t start = BeginValue();
    out_.append(text);
    EndValue(start);
    return true;
  }

  // True when the value about to be parsed or just parsed sits at `p`.
  bool AtPointer(const ParsedPointer& p) const {
    if (p.tokens.size() != frames_.size()) return false;
    return PrefixMatches(p, frames_.size());
  }
  // True when the first `n` tokens of `p` name the current position.
  bool PrefixMatches(const ParsedPointer& p, std::size_t n) const {
    for (std::size_t i = 0; i < n; ++i) {
      const Frame& f = frames_[i];
      if (f.is_object ? std::string_view(p.tokens[i]) != KeyOf(f) : p.indices[i] != f.count) return false;
    }
    return true;
  }

  // A value starts at the current position: an array element after the
  // first gets its comma. Returns where the value's text starts. A repeated
  // object key replaces the earlier value, so what was captured inside the
  // earlier one is void.
  std::size_t BeginValue() {
    if (!frames_.empty() && !frames_.back().is_object && frames_.back().count > 0) out_.push_back(',');
    if (pointers_ != nullptr) {
      for (std::size_t i = 0; i < pointers_->size(); ++i) {
        const ParsedPointer& p = (*pointers_)[i];
        if (p.valid && p.tokens.size() >= frames_.size() && PrefixMatches(p, frames_.size())) {
          captures_[i].reset();
        }
      }
    }
    return out_.size();
  }

  // The value whose text starts at `start` is complete.
  void EndValue(std::size_t start) {
    if (pointers_ != nullptr) {
      for (std::size_t i = 0; i < pointers_->size(); ++i) {
        if ((*pointers_)[i].valid && AtPointer((*pointers_)[i])) captures_[i].emplace(out_.view().substr(start));
      }
    }
    if (frames_.empty()) return;
    Frame& top = frames_.back();
    if (top.is_object) members_.back().end = out_.size();
    ++top.count;
  }

  const std::vector<ParsedPointer>* pointers_;
  std::uintptr_t input_begin_;  // the document's text, as addresses
  std::uintptr_t input_end_;
  std::pmr::vector<Frame> frames_;
  std::pmr::vector<Member> members_;  // members of every open object, innermost last
  std::pmr::string keys_;             // their raw keys
  std::pmr::string part_;
  std::pmr::vector<std::size_t> order_;  // Reorder's sort order, reused
  OutputBuffer out_;
  std::vector<std::optional<std::string>> captures_;
};

// A JSON parser writing the canonical form of one document.
class CanonicalParser {
 public:
  CanonicalParser(std::string_view text, const std::vector<ParsedPointer>* pointers, std::pmr::memory_resource* mr)
      : parser_(Options(), pointers, mr, text), text_(text) {}

  // Parses the text; true when it is one valid and complete JSON document.
  bool Run() {
    json::error_code ec;
    const std::size_t used = parser_.write_some(false, text_.data(), text_.size(), ec);
    return !ec && used == text_.size() && parser_.done();
  }
  CanonicalHandler& handler() { return parser_.handler(); }

 private:
  static json::parse_options Options() {
    json::parse_options options;
    options.max_depth = kMaxJsonDepth;
    return options;
  }

  json::basic_parser<CanonicalHandler> parser_;
  std::string_view text_;
};

// SHA-256 fetched once: an implicit fetch on every digest costs more than
// hashing a small request.
const EVP_MD* Sha256Digest() {
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

// One digest context per thread, reused: Sha256 objects are never nested.
EVP_MD_CTX* ThreadDigestContext() {
  struct Holder {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    ~Holder() { EVP_MD_CTX_free(ctx); }
  };
  thread_local Holder holder;
  return holder.ctx;
}

// SHA-256 over many small parts. Parts are gathered in a buffer and handed
// to the digest in one call per buffer: each EVP_DigestUpdate call costs
// more than hashing the few bytes of a framing length.
class Sha256 {
 public:
  Sha256() : ctx_(ThreadDigestContext()) { EVP_DigestInit_ex2(ctx_, Sha256Digest(), nullptr); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Raw(std::string_view data) {
    if (used_ + data.size() > sizeof buffer_) {
      Flush();
      if (data.size() >= sizeof buffer_) {
        EVP_DigestUpdate(ctx_, data.data(), data.size());
        return;
      }
    }
    if (!data.empty()) std::memcpy(buffer_ + used_, data.data(), data.size());
    used_ += data.size();
  }
  // A little-endian 64-bit integer. On little-endian hosts it is copied
  // whole: assembled byte by byte on the stack, it was read back as one
  // word before its byte stores had landed (a store-forwarding stall of
  // about 10 cycles on each of the dozen integers a fingerprint hashes).
  void U64(std::uint64_t v) {
    if constexpr (std::endian::native != std::endian::little) v = __builtin_bswap64(v);
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    Raw(std::string_view(b, sizeof b));
  }
  // One length-prefixed component.
  void Part(std::string_view data) {
    U64(data.size());
    Raw(data);
  }
  std::string Finish() {
    Flush();
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, digest, &n);
    return std::string(reinterpret_cast<const char*>(digest), n);
  }

 private:
  void Flush() {
    if (used_ > 0) EVP_DigestUpdate(ctx_, buffer_, used_);
    used_ = 0;
  }

  EVP_MD_CTX* ctx_;
  std::size_t used_ = 0;
  char buffer_[1024];
};

// Appends the canonical form of a JSON number (see CanonicalJsonNumber).
template <typename Output>
void AppendCanonicalJsonNumber(Output* out, std::string_view number) {
  std::string_view s = number;
  const bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  const std::size_t int_end = std::min(s.find_first_of(".eE"), s.size());
  std::string_view int_part = s.substr(0, int_end);
  std::string_view frac_part;
  std::string_view rest = s.substr(int_end);
  if (!rest.empty() && rest.front() == '.') {
    rest.remove_prefix(1);
    const std::size_t frac_end = std::min(rest.find_first_of("eE"), rest.size());
    frac_part = rest.substr(0, frac_end);
    rest.remove_prefix(frac_end);
  }
  std::int64_t exponent = 0;
  if (!rest.empty()) {
    rest.remove_prefix(1);  // 'e' or 'E'
    bool exp_negative = false;
    if (!rest.empty() && (rest.front() == '+' || rest.front() == '-')) {
      exp_negative = rest.front() == '-';
      rest.remove_prefix(1);
    }
    while (rest.size() > 1 && rest.front() == '0') rest.remove_prefix(1);
    if (rest.size() > kMaxExponentDigits) {
      out->push_back('~');
      out->append(number);
      return;
    }
    for (char c : rest) exponent = exponent * 10 + (c - '0');
    if (exp_negative) exponent = -exponent;
  }

  std::string digits;
  digits.reserve(int_part.size() + frac_part.size());
  digits.append(int_part);
  digits.append(frac_part);
  exponent -= static_cast<std::int64_t>(frac_part.size());
  const std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) {
    out->push_back('0');
    return;
  }
  digits.erase(0, first);
  const std::size_t last = digits.find_last_not_of('0');
  exponent += static_cast<std::int64_t>(digits.size() - 1 - last);
  digits.erase(last + 1);

  if (negative) out->push_back('-');
  out->append(digits);
  if (exponent >= 0 && digits.size() + static_cast<std::uint64_t>(exponent) <= kMaxPlainIntegerDigits) {
    out->append(static_cast<std::size_t>(exponent), '0');
  } else {
    out->push_back('e');
    char buf[24];
    const auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, exponent);
    out->append(buf, static_cast<std::size_t>(ptr - buf));
  }
}

}  // namespace

std::string CanonicalJsonNumber(std::string_view number) {
  std::string out;
  AppendCanonicalJsonNumber(&out, number);
  return out;
}

// Where the handler's bookkeeping lives while one document is made
// canonical. Small documents use a stack buffer and never free: what a
// monotonic buffer drops is what the handler's vectors and strings leave
// behind when they grow, at most about as much as they hold at the end.
// Larger documents use the heap, freeing as they go.
class ScratchMemory {
 public:
  static constexpr std::size_t kStackBytes = 8 * 1024;
  static constexpr std::size_t kMaxMonotonicInput = 4 * 1024;

  explicit ScratchMemory(std::size_t input_size)
      : monotonic_(buffer_.data(), buffer_.size(), std::pmr::new_delete_resource()),
        resource_(input_size <= kMaxMonotonicInput ? static_cast<std::pmr::memory_resource*>(&monotonic_)
                                                    : std::pmr::new_delete_resource()) {}
  std::pmr::memory_resource* resource() { return resource_; }

 private:
  alignas(std::max_align_t) std::array<std::byte, kStackBytes> buffer_;
  std::pmr::monotonic_buffer_resource monotonic_;
  std::pmr::memory_resource* resource_;
};

namespace {

// Calls `use` with the canonical form of `text` (valid until it returns);
// false, without calling it, when `text` is not valid JSON.
template <typename Use>
bool WithCanonicalJson(std::string_view text, Use&& use) {
  ScratchMemory scratch(text.size());
  CanonicalParser parser(text, nullptr, scratch.resource());
  if (!parser.Run()) return false;
  use(parser.handler().output());
  return true;
}

}  // namespace

StatusOr<std::string> CanonicalJson(std::string_view text) {
  std::string out;
  if (!WithCanonicalJson(text, [&out](std::string_view canonical) { out.assign(canonical); })) {
    return InvalidArgumentError("not valid JSON");
  }
  return out;
}

StatusOr<std::vector<std::optional<std::string>>> CanonicalJsonFields(
    std::string_view text, const std::vector<std::string>& pointers) {
  std::vector<ParsedPointer> parsed;
  parsed.reserve(pointers.size());
  for (const std::string& p : pointers) parsed.push_back(ParsePointer(p));
  ScratchMemory scratch(text.size());
  CanonicalParser parser(text, &parsed, scratch.resource());
  if (!parser.Run()) return InvalidArgumentError("not valid JSON");
  return std::move(parser.handler().captures());
}

bool IsValidJsonPointer(std::string_view pointer) { return ParsePointer(pointer).valid; }

bool IsJsonContentType(std::string_view content_type) {
  // "text/plain, application/json" is two values on one line, as two lines
  // are: an upstream may go by the one that is not JSON.
  if (content_type.find(',') != std::string_view::npos) return false;
  std::string_view media = content_type.substr(0, std::min(content_type.find(';'), content_type.size()));
  while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.remove_prefix(1);
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  const std::size_t slash = media.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= media.size()) return false;
  if (EqualsIgnoreCaseAscii(media, "application/json")) return true;
  const std::string_view subtype = media.substr(slash + 1);
  return subtype.size() > 5 && EqualsIgnoreCaseAscii(subtype.substr(subtype.size() - 5), "+json");
}

std::string ComputeFingerprint(const FingerprintRequest& request, const FingerprintRules& rules) {
  Sha256 h;
  h.Part("idemgate-fingerprint-v1");
  h.Part(request.method);
  h.Part(request.route_id);
  h.Part(request.target);

  h.U64(rules.headers.size());
  for (const std::string& name : rules.headers) {
    // The same bytes as Part(lower-cased name), without a copy on the heap.
    h.U64(name.size());
    char lower[64];
    for (std::size_t pos = 0; pos < name.size(); pos += sizeof lower) {
      const std::size_t n = std::min(sizeof lower, name.size() - pos);
      for (std::size_t i = 0; i < n; ++i) lower[i] = LowerAscii(name[pos + i]);
      h.Raw(std::string_view(lower, n));
    }
    std::uint64_t lines = 0;
    for (const HeaderView& header : request.headers) {
      if (EqualsIgnoreCaseAscii(header.name, name)) ++lines;
    }
    h.U64(lines);
    for (const HeaderView& header : request.headers) {
      if (EqualsIgnoreCaseAscii(header.name, name)) h.Part(header.value);
    }
  }

  // JSON is canonicalised only under one Content-Type line: with two, an
  // upstream may go by the other, and read the body as text.
  bool json_body = false;
  std::size_t content_types = 0;
  for (const HeaderView& header : request.headers) {
    if (EqualsIgnoreCaseAscii(header.name, "content-type")) {
      json_body = ++content_types == 1 && IsJsonContentType(header.value);
    }
  }
  if (json_body && !rules.json_fields.empty()) {
    auto fields = CanonicalJsonFields(request.body, rules.json_fields);
    if (fields.ok()) {
      h.Part("fields");
      h.U64(rules.json_fields.size());
      for (std::size_t i = 0; i < rules.json_fields.size(); ++i) {
        h.Part(rules.json_fields[i]);
        const std::optional<std::string>& value = (*fields)[i];
        if (value.has_value()) {
          h.Part("present");
          h.Part(*value);
        } else {
          h.Part("absent");
        }
      }
      return h.Finish();
    }
  } else if (json_body && rules.json == JsonMode::kCanonical) {
    const bool parsed = WithCanonicalJson(request.body, [&h](std::string_view canonical) {
      h.Part("json");
      h.Part(canonical);
    });
    if (parsed) return h.Finish();
  }
  h.Part("raw");
  h.Part(request.body);
  return h.Finish();
}

}  // namespace idemgate::core
