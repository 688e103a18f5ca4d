// Canonical JSON (CanonicalJson, CanonicalJsonFields, CanonicalJsonNumber,
// IsValidJsonPointer) and the request fingerprint built on it. The first
// byte chooses how many of the following '\n'-terminated lines are JSON
// Pointers (0 to 3) and how the document is re-spelt; the rest is the body.
// Checked:
// - a body is accepted exactly when Boost.JSON's DOM parser accepts it with
//   the same options (nesting ≤ 64, strict UTF-8, no comments), and nesting
//   beyond 64 is refused rather than recursed into;
// - the canonical form is canonical: no white space, keys strictly ascending
//   by bytes, only '"', '\' and control characters escaped (\u00xx), every
//   number a fixed point of CanonicalJsonNumber;
// - the same document spelt otherwise (white space, members reordered, an
//   earlier member under the same key, needless escapes, numbers written
//   as other spellings of their value) has the same canonical form, so the
//   canonical form of the canonical form is itself;
// - CanonicalJsonFields finds, on any spelling, the canonical text of each
//   of the document's first 48 values (pre-order) at its pointer, and at
//   the fuzzed pointers what a reference lookup finds; IsValidJsonPointer
//   agrees with RFC 6901's grammar;
// - the fingerprint is 32 bytes, equal for every spelling of a JSON body,
//   equal to the raw-bytes fingerprint when the body is not JSON.

#include <algorithm>
#include <boost/json.hpp>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/fingerprint.h"
#include "fuzz_target.h"

namespace core = idemgate::core;

namespace {

constexpr std::size_t kMaxDepth = 64;  // CanonicalJson's documented limit

// A value of a canonical text: its kind, its span of the text, and what it
// contains.
struct Node {
  enum Kind { kObject, kArray, kString, kNumber, kLiteral } kind = kLiteral;
  std::string_view text;
  std::string string;  // kString: the decoded value
  std::vector<std::string> keys;  // kObject: decoded, ascending; keys[i] is elements[i]'s
  std::vector<Node> elements;     // kArray, kObject
};

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// Reads the canonical text `in`, failing on anything the canonical form must
// not contain. Recursion is bounded by the nesting CanonicalJson accepts.
class CanonicalReader {
 public:
  explicit CanonicalReader(std::string_view in) : in_(in) {}

  bool ReadDocument(Node* node) { return Value(node, 0) && pos_ == in_.size(); }

 private:
  bool Value(Node* node, std::size_t depth) {
    if (pos_ >= in_.size()) return false;
    const std::size_t start = pos_;
    bool ok = false;
    switch (in_[pos_]) {
      case '{': ok = depth < kMaxDepth && Object(node, depth + 1); break;
      case '[': ok = depth < kMaxDepth && Array(node, depth + 1); break;
      case '"': node->kind = Node::kString; ok = String(&node->string); break;
      case 't': ok = Word("true"); break;
      case 'f': ok = Word("false"); break;
      case 'n': ok = Word("null"); break;
      default: node->kind = Node::kNumber; ok = Number(); break;
    }
    node->text = in_.substr(start, pos_ - start);
    return ok;
  }
  bool Object(Node* node, std::size_t depth) {
    node->kind = Node::kObject;
    ++pos_;
    if (Eat('}')) return true;
    do {
      std::string key;
      Node value;
      if (!String(&key) || !Eat(':') || !Value(&value, depth)) return false;
      // Strictly ascending: sorted, and a repeated key kept once.
      if (!node->keys.empty() && !(node->keys.back() < key)) return false;
      node->keys.push_back(std::move(key));
      node->elements.push_back(std::move(value));
    } while (Eat(','));
    return Eat('}');
  }
  bool Array(Node* node, std::size_t depth) {
    node->kind = Node::kArray;
    ++pos_;
    if (Eat(']')) return true;
    do {
      node->elements.emplace_back();
      if (!Value(&node->elements.back(), depth)) return false;
    } while (Eat(','));
    return Eat(']');
  }
  // Only '"', '\\' and control characters are escaped, the last as \u00xx.
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) return false;
      const char e = in_[pos_++];
      if (e == '"' || e == '\\') {
        out->push_back(e);
        continue;
      }
      if (e != 'u' || pos_ + 4 > in_.size() || in_.substr(pos_, 2) != "00" || !IsHex(in_[pos_ + 2]) ||
          !IsHex(in_[pos_ + 3]) || in_[pos_ + 2] > '1') {
        return false;
      }
      out->push_back(static_cast<char>(std::stoi(std::string(in_.substr(pos_ + 2, 2)), nullptr, 16)));
      pos_ += 4;
    }
    return false;
  }
  // A number is its own canonical form, or "~" and the literal of one whose
  // exponent is too long to compute with.
  bool Number() {
    const std::size_t start = pos_;
    const bool literal = Eat('~');
    while (pos_ < in_.size() && std::string_view("0123456789+-.eE").find(in_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
    const std::string_view number = in_.substr(start + (literal ? 1 : 0), pos_ - start - (literal ? 1 : 0));
    if (number.empty()) return false;
    if (literal) return core::CanonicalJsonNumber(number) == "~" + std::string(number);
    return core::CanonicalJsonNumber(number) == number;
  }
  bool Word(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  bool Eat(char c) {
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string_view in_;
  std::size_t pos_ = 0;
};

// How a document is spelt again.
struct Spelling {
  bool spaces = false;
  bool reorder = false;
  bool shadow = false;   // an earlier member under each key, with another value
  bool escapes = false;
  bool numbers = false;
};

// Writes a document (a tree read from a canonical text) as valid JSON of
// the same value, spelt as `how` says, with choices from `rng`.
class Speller {
 public:
  Speller(Spelling how, std::uint32_t seed) : how_(how), rng_(seed) {}

  void Document(const Node& node, std::string* out) {
    Space(out);
    Value(node, out);
    Space(out);
  }

 private:
  bool Coin() { return (rng_() & 1) != 0; }
  std::size_t Pick(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }

  void Space(std::string* out) {
    if (!how_.spaces) return;
    static constexpr std::string_view kSpaces[] = {"", " ", "\n", "\t", "\r\n  "};
    out->append(kSpaces[Pick(std::size(kSpaces))]);
  }

  void Value(const Node& node, std::string* out) {
    switch (node.kind) {
      case Node::kObject: Object(node, out); break;
      case Node::kArray:
        out->push_back('[');
        for (std::size_t i = 0; i < node.elements.size(); ++i) {
          if (i > 0) out->push_back(',');
          Space(out);
          Value(node.elements[i], out);
          Space(out);
        }
        out->push_back(']');
        break;
      case Node::kString: String(node.string, out); break;
      case Node::kNumber: Number(node.text, out); break;
      case Node::kLiteral: out->append(node.text); break;
    }
  }

  void Object(const Node& node, std::string* out) {
    std::vector<std::size_t> order(node.keys.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (how_.reorder) std::shuffle(order.begin(), order.end(), rng_);
    out->push_back('{');
    bool first = true;
    for (const std::size_t i : order) {
      const std::string& key = node.keys[i];
      const Node& value = node.elements[i];
      // The earlier member has the same shape but other scalars, so that
      // what a pointer found in it must be forgotten.
      if (how_.shadow && Coin()) {
        if (!first) out->push_back(',');
        first = false;
        String(key, out);
        out->push_back(':');
        Shadow(value, out);
      }
      if (!first) out->push_back(',');
      first = false;
      Space(out);
      String(key, out);
      Space(out);
      out->push_back(':');
      Space(out);
      Value(value, out);
    }
    out->push_back('}');
  }

  // `node`'s shape with every scalar replaced, as plain JSON.
  void Shadow(const Node& node, std::string* out) {
    switch (node.kind) {
      case Node::kObject:
        out->push_back('{');
        for (std::size_t i = 0; i < node.keys.size(); ++i) {
          if (i > 0) out->push_back(',');
          String(node.keys[i], out);
          out->push_back(':');
          Shadow(node.elements[i], out);
        }
        out->push_back('}');
        break;
      case Node::kArray:
        out->push_back('[');
        for (std::size_t i = 0; i < node.elements.size(); ++i) {
          if (i > 0) out->push_back(',');
          Shadow(node.elements[i], out);
        }
        out->push_back(']');
        break;
      default: out->append(node.text == "null" ? "\"shadow\"" : "null"); break;
    }
  }

  void Hex4(unsigned v, std::string* out) {
    static constexpr char kLower[] = "0123456789abcdef";
    static constexpr char kUpper[] = "0123456789ABCDEF";
    const char* digits = Coin() ? kLower : kUpper;
    out->append("\\u");
    for (int shift = 12; shift >= 0; shift -= 4) out->push_back(digits[(v >> shift) & 0xf]);
  }

  // Escapes needlessly at random: any code point as \uXXXX (a surrogate pair
  // above the BMP), '/' as "\/", control characters by their short names.
  void String(std::string_view s, std::string* out) {
    out->push_back('"');
    for (std::size_t i = 0; i < s.size();) {
      const auto u = static_cast<unsigned char>(s[i]);
      const std::size_t length = u < 0x80 ? 1 : u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2;
      const bool escape = u < 0x20 || u == '"' || u == '\\' || (how_.escapes && Pick(4) == 0);
      if (!escape || i + length > s.size()) {
        out->append(s.substr(i, std::min(length, s.size() - i)));
        i += length;
        continue;
      }
      unsigned cp = length == 1 ? u : u & (0xff >> (length + 1));
      for (std::size_t k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += length;
      static constexpr std::string_view kShort = "\b\f\n\r\t\"\\/";
      static constexpr std::string_view kShortNames = "bfnrt\"\\/";
      const std::size_t short_at = cp < 0x80 ? kShort.find(static_cast<char>(cp)) : std::string_view::npos;
      if (short_at != std::string_view::npos && Coin()) {
        out->push_back('\\');
        out->push_back(kShortNames[short_at]);
      } else if (cp >= 0x10000) {
        Hex4(0xd800 + ((cp - 0x10000) >> 10), out);
        Hex4(0xdc00 + ((cp - 0x10000) & 0x3ff), out);
      } else {
        Hex4(cp, out);
      }
    }
    out->push_back('"');
  }

  // Another spelling of the canonical number `text`: trailing zeros moved
  // into the exponent, a fraction, an 'E', a '+', leading zeros in the
  // exponent.
  void Number(std::string_view text, std::string* out) {
    if (text.starts_with('~')) {
      // The literal of a number with a huge exponent: its spelling is kept
      // in the canonical form, so it can only be written as it was.
      out->append(text.substr(1));
      return;
    }
    if (!how_.numbers) {
      out->append(text);
      return;
    }
    const bool negative = text.starts_with('-');
    if (negative) text.remove_prefix(1);
    const std::size_t e = text.find('e');
    std::string digits(text.substr(0, e));
    long long exponent = e == std::string_view::npos ? 0 : std::stoll(std::string(text.substr(e + 1)));
    if (digits == "0") {
      static constexpr std::string_view kZeros[] = {"0", "-0", "0.0", "-0.000", "0e7", "0E-12", "-0.0e+3"};
      out->append(kZeros[Pick(std::size(kZeros))]);
      return;
    }
    while (digits.size() > 1 && digits.back() == '0') {
      digits.pop_back();
      ++exponent;
    }
    if (exponent > 100'000'000'000'000LL || exponent < -100'000'000'000'000LL) {
      out->append(negative ? "-" : "").append(text);
      return;
    }
    if (negative) out->push_back('-');
    const std::size_t zeros = Pick(4);
    switch (Pick(3)) {
      case 0:  // D000e(E-3)
        out->append(digits).append(zeros, '0');
        exponent -= static_cast<long long>(zeros);
        break;
      case 1:  // 0.D e(E+len)
        out->append("0.").append(digits).append(zeros, '0');
        exponent += static_cast<long long>(digits.size());
        break;
      default:  // D[0].D[1..]000 e(E+len-1)
        out->push_back(digits[0]);
        out->push_back('.');
        out->append(digits.substr(1)).append(zeros + 1, '0');
        exponent += static_cast<long long>(digits.size()) - 1;
        break;
    }
    if (exponent == 0 && Coin()) return;
    out->push_back(Coin() ? 'e' : 'E');
    if (exponent >= 0 && Coin()) out->push_back('+');
    if (exponent < 0) out->push_back('-');
    out->append(Pick(3), '0');
    out->append(std::to_string(exponent < 0 ? -exponent : exponent));
  }

  Spelling how_;
  std::mt19937 rng_;
};

// A pointer to every value of `node` (pre-order, at most `limit`), with the
// value's canonical text.
void AllPointers(const Node& node, const std::string& pointer, std::size_t limit,
                 std::vector<std::pair<std::string, std::string_view>>* out) {
  if (out->size() >= limit) return;
  out->emplace_back(pointer, node.text);
  if (node.kind == Node::kObject) {
    for (std::size_t i = 0; i < node.keys.size(); ++i) {
      std::string token;
      for (char c : node.keys[i]) {
        if (c == '~') token += "~0";
        else if (c == '/') token += "~1";
        else token.push_back(c);
      }
      AllPointers(node.elements[i], pointer + "/" + token, limit, out);
    }
  } else if (node.kind == Node::kArray) {
    for (std::size_t i = 0; i < node.elements.size(); ++i) {
      AllPointers(node.elements[i], pointer + "/" + std::to_string(i), limit, out);
    }
  }
}

// RFC 6901: "" or ("/" token)*, every '~' followed by '0' or '1'.
bool ReferenceValidPointer(std::string_view p) {
  if (p.empty()) return true;
  if (p.front() != '/') return false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '~' && (i + 1 >= p.size() || (p[i + 1] != '0' && p[i + 1] != '1'))) return false;
  }
  return true;
}

// The canonical text of the value at the valid pointer `p`, if any.
std::optional<std::string_view> ReferenceLookup(const Node& root, std::string_view p) {
  const Node* node = &root;
  while (!p.empty()) {
    p.remove_prefix(1);  // '/'
    const std::size_t end = std::min(p.find('/'), p.size());
    std::string token;
    for (std::size_t i = 0; i < end; ++i) {
      if (p[i] == '~') {
        token.push_back(p[++i] == '0' ? '~' : '/');
      } else {
        token.push_back(p[i]);
      }
    }
    p.remove_prefix(end);
    if (node->kind == Node::kObject) {
      const auto it = std::find(node->keys.begin(), node->keys.end(), token);
      if (it == node->keys.end()) return std::nullopt;
      node = &node->elements[static_cast<std::size_t>(it - node->keys.begin())];
    } else if (node->kind == Node::kArray) {
      // An index: digits without a leading zero ("-", past the end, is no element).
      if (token.empty() || token.size() > 9 || (token.size() > 1 && token[0] == '0') ||
          !std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return std::nullopt;
      }
      const std::size_t index = std::stoul(token);
      if (index >= node->elements.size()) return std::nullopt;
      node = &node->elements[index];
    } else {
      return std::nullopt;
    }
  }
  return node->text;
}

// The nesting of the valid JSON text `text`: 0 for a scalar, 1 for "[]".
std::size_t Depth(std::string_view text) {
  std::size_t depth = 0;
  std::size_t open = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      depth = std::max(depth, ++open);
    } else if (ch == ']' || ch == '}') {
      --open;
    }
  }
  return depth;
}

bool BoostAccepts(std::string_view text) {
  boost::json::parse_options options;
  options.max_depth = kMaxDepth;
  boost::json::error_code ec;
  boost::json::monotonic_resource mr;
  (void)boost::json::parse(text, ec, &mr, options);
  return !ec;
}

std::string Fingerprint(std::string_view body, std::string_view content_type, core::JsonMode mode,
                        const std::vector<std::string>& fields = {}, std::string_view header_name = "Content-Type") {
  core::FingerprintRequest request;
  request.method = "POST";
  request.route_id = "r";
  request.target = "/v1/x";
  request.headers = {{"X-Other", "1"}, {header_name, content_type}};
  request.body = body;
  core::FingerprintRules rules;
  rules.json = mode;
  rules.json_fields = fields;
  std::string fp = core::ComputeFingerprint(request, rules);
  FUZZ_CHECK(fp.size() == 32);
  return fp;
}

}  // namespace

IDEMGATE_FUZZ_TARGET(json) {
  if (size == 0) return 0;
  const std::uint8_t control = data[0];
  std::string_view rest = idemgate::fuzz::AsView(data + 1, size - 1);
  std::vector<std::string> fuzzed_pointers;
  for (int n = control & 0x03; n > 0; --n) {
    const std::size_t end = rest.find('\n');
    if (end == std::string_view::npos) break;
    fuzzed_pointers.emplace_back(rest.substr(0, end));
    rest.remove_prefix(end + 1);
  }
  const std::string_view body = rest;
  Spelling how;
  how.spaces = (control & 0x04) != 0;
  how.reorder = (control & 0x08) != 0;
  how.shadow = (control & 0x10) != 0;
  how.escapes = (control & 0x20) != 0;
  how.numbers = (control & 0x40) != 0;
  std::uint32_t seed = 2166136261u;  // FNV-1a of the input: the same choices for the same input
  for (std::size_t i = 0; i < size; ++i) seed = (seed ^ data[i]) * 16777619u;

  for (const std::string& p : fuzzed_pointers) FUZZ_CHECK(core::IsValidJsonPointer(p) == ReferenceValidPointer(p));

  const auto canonical = core::CanonicalJson(body);
  FUZZ_CHECK(canonical.ok() == BoostAccepts(body));
  const auto fuzzed_fields = core::CanonicalJsonFields(body, fuzzed_pointers);
  FUZZ_CHECK(fuzzed_fields.ok() == canonical.ok());

  // Not JSON: the fingerprint takes the bytes, in every mode.
  const std::string raw_fp = Fingerprint(body, "application/json", core::JsonMode::kRaw);
  if (!canonical.ok()) {
    FUZZ_CHECK(Fingerprint(body, "application/json", core::JsonMode::kCanonical) == raw_fp);
    FUZZ_CHECK(Fingerprint(body, "application/json", core::JsonMode::kCanonical, {"/a"}) == raw_fp);
    return 0;
  }
  FUZZ_CHECK(Fingerprint(body, "text/plain", core::JsonMode::kCanonical) ==
             Fingerprint(body, "text/plain", core::JsonMode::kRaw));

  const std::string& c = *canonical;
  Node root;
  CanonicalReader reader(c);
  FUZZ_CHECK(reader.ReadDocument(&root));
  const bool has_literal_number = c.find('~') != std::string::npos && !BoostAccepts(c);
  if (!has_literal_number) {
    const auto again = core::CanonicalJson(c);
    FUZZ_CHECK(again.ok() && *again == c);
  }

  // Nesting: the limit is on the text (an earlier member under a repeated
  // key counts too); as deep as the limit is accepted, one level more is not.
  const std::size_t depth = Depth(body);
  FUZZ_CHECK(Depth(c) <= depth && depth <= kMaxDepth);
  if (control & 0x80) {
    for (const std::size_t levels : {kMaxDepth - depth, kMaxDepth - depth + 1}) {
      const std::string deep = std::string(levels, '[') + std::string(body) + std::string(levels, ']');
      const auto result = core::CanonicalJson(deep);
      FUZZ_CHECK(result.ok() == (depth + levels <= kMaxDepth));
      if (result.ok()) FUZZ_CHECK(*result == std::string(levels, '[') + c + std::string(levels, ']'));
    }
  }

  // Another spelling of the same document.
  std::string respelt;
  Speller(how, seed).Document(root, &respelt);
  const auto respelt_canonical = core::CanonicalJson(respelt);
  FUZZ_CHECK(respelt_canonical.ok() && *respelt_canonical == c);

  // Every value is found at its pointer, in both spellings; the fuzzed
  // pointers find what the reference lookup finds.
  std::vector<std::pair<std::string, std::string_view>> all;
  AllPointers(root, "", 48, &all);
  std::vector<std::string> pointers;
  for (const auto& [pointer, text] : all) pointers.push_back(pointer);
  for (const std::string_view text : {body, std::string_view(respelt)}) {
    const auto fields = core::CanonicalJsonFields(text, pointers);
    FUZZ_CHECK(fields.ok() && fields->size() == all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      FUZZ_CHECK((*fields)[i].has_value() && *(*fields)[i] == all[i].second);
    }
  }
  for (const std::string_view text : {body, std::string_view(respelt)}) {
    const auto fields = core::CanonicalJsonFields(text, fuzzed_pointers);
    FUZZ_CHECK(fields.ok() && fields->size() == fuzzed_pointers.size());
    for (std::size_t i = 0; i < fuzzed_pointers.size(); ++i) {
      std::optional<std::string_view> want;
      if (ReferenceValidPointer(fuzzed_pointers[i])) want = ReferenceLookup(root, fuzzed_pointers[i]);
      FUZZ_CHECK((*fields)[i].has_value() == want.has_value());
      if (want) FUZZ_CHECK(*(*fields)[i] == *want);
    }
  }

  // The fingerprint of a JSON body is that of its canonical form, whatever
  // the spelling and however the content-type header name is cased.
  const std::string fp = Fingerprint(body, "application/json", core::JsonMode::kCanonical);
  FUZZ_CHECK(fp != raw_fp);
  FUZZ_CHECK(Fingerprint(respelt, "application/json", core::JsonMode::kCanonical, {}, "CONTENT-type") == fp);
  if (!has_literal_number) FUZZ_CHECK(Fingerprint(c, "application/json", core::JsonMode::kCanonical) == fp);
  constexpr std::string_view kPlusJson = "application/vnd.x+json; charset=utf-8";
  FUZZ_CHECK(Fingerprint(respelt, kPlusJson, core::JsonMode::kCanonical) ==
             Fingerprint(body, kPlusJson, core::JsonMode::kCanonical));
  FUZZ_CHECK(Fingerprint(respelt, kPlusJson, core::JsonMode::kRaw) !=
             Fingerprint(body, kPlusJson, core::JsonMode::kCanonical));
  std::vector<std::string> fields = fuzzed_pointers;
  fields.push_back(pointers.back());
  FUZZ_CHECK(Fingerprint(respelt, "application/json", core::JsonMode::kRaw, fields) ==
             Fingerprint(body, "application/json", core::JsonMode::kCanonical, fields));
  return 0;
}
