#include "core/fingerprint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace idemgate::core {
namespace {

struct Req {
  std::string method = "POST";
  std::string route = "payments";
  std::string target = "/v1/payments?x=1";
  std::vector<std::pair<std::string, std::string>> headers = {
      {"Content-Type", "application/json"}};
  std::string body = R"({"amount":100,"currency":"eur"})";
};

std::string Fp(const Req& r, const FingerprintRules& rules = {}) {
  FingerprintRequest request;
  request.method = r.method;
  request.route_id = r.route;
  request.target = r.target;
  for (const auto& [n, v] : r.headers) request.headers.push_back({n, v});
  request.body = r.body;
  return ComputeFingerprint(request, rules);
}

std::string Canon(std::string_view json) {
  StatusOr<std::string> c = CanonicalJson(json);
  EXPECT_TRUE(c.ok()) << json;
  return c.ok() ? *c : std::string("<invalid>");
}

TEST(FingerprintTest, IsARawSha256Digest) {
  EXPECT_EQ(Fp(Req{}).size(), 32u);
  EXPECT_EQ(Fp(Req{}), Fp(Req{}));
  EXPECT_EQ(ToHex(Fp(Req{})).size(), 64u);
}

// Stores keep fingerprints across restarts and upgrades: a change to these
// digests would turn every retry of a request stored before it into a 422.
TEST(FingerprintTest, DigestsAreStableAcrossVersions) {
  FingerprintRules rules;
  rules.headers = {"x-tenant", "x-absent"};
  Req json;
  json.headers = {{"Content-Type", "application/json"}, {"X-Tenant", "t1"}};
  json.body = R"({"b":[1,2.50,{"d":"\u00e9","c":null}],"a":"x"})";
  EXPECT_EQ(ToHex(Fp(json, rules)), "d1e2276b02b9dfad9d8fe4098c20429788c595d4a59bfe0c1bc7a5bab34abba9");
  Req raw;
  raw.headers = {{"Content-Type", "text/plain"}, {"X-Tenant", "t1"}};
  raw.body = std::string(3000, 'x');  // longer than the digest's gathering buffer
  EXPECT_EQ(ToHex(Fp(raw, rules)), "753f3389b48625d06a8ffb950729603c8956ccdec467b8d002b7a6c847720f3e");
  FingerprintRules fields = rules;
  fields.json_fields = {"/b/2", "/a", "/zz"};
  EXPECT_EQ(ToHex(Fp(json, fields)), "61737bcbb8ea4b258dd856812e6d284aa8b828c279af38a78527a6cb5ee68308");
}

TEST(FingerprintTest, ToHex) { EXPECT_EQ(ToHex(std::string("\x00\xff\x1a", 3)), "00ff1a"); }

TEST(FingerprintTest, EachRequestPartCounts) {
  const std::string base = Fp(Req{});
  Req r;
  r.method = "PATCH";
  EXPECT_NE(Fp(r), base);
  r = Req{};
  r.method = "post";
  EXPECT_NE(Fp(r), base);
  r = Req{};
  r.route = "refunds";
  EXPECT_NE(Fp(r), base);
  r = Req{};
  r.target = "/v1/payments?x=2";
  EXPECT_NE(Fp(r), base);
  r = Req{};
  r.target = "/v1/payments";
  EXPECT_NE(Fp(r), base);
  r = Req{};
  r.body = R"({"amount":101,"currency":"eur"})";
  EXPECT_NE(Fp(r), base);
}

TEST(FingerprintTest, OnlyNamedHeadersCount) {
  Req a;
  Req b;
  b.headers.push_back({"X-Request-Id", "abc"});
  EXPECT_EQ(Fp(a), Fp(b));
  FingerprintRules rules;
  rules.headers = {"content-type", "x-tenant-region"};
  Req c = a;
  c.headers.push_back({"X-Tenant-Region", "eu"});
  EXPECT_NE(Fp(a, rules), Fp(c, rules));
  EXPECT_EQ(Fp(a), Fp(c));
}

TEST(FingerprintTest, HeaderNamesAreCaseInsensitiveValuesAreNot) {
  FingerprintRules rules;
  rules.headers = {"X-Region"};
  Req a;
  a.headers.push_back({"x-region", "eu"});
  Req b;
  b.headers.push_back({"X-REGION", "eu"});
  Req c;
  c.headers.push_back({"X-Region", "EU"});
  EXPECT_EQ(Fp(a, rules), Fp(b, rules));
  EXPECT_NE(Fp(a, rules), Fp(c, rules));
}

TEST(FingerprintTest, AbsentHeaderDiffersFromEmptyHeader) {
  FingerprintRules rules;
  rules.headers = {"x-region"};
  Req absent;
  Req empty;
  empty.headers.push_back({"X-Region", ""});
  EXPECT_NE(Fp(absent, rules), Fp(empty, rules));
}

TEST(FingerprintTest, RepeatedHeaderLinesCountInOrder) {
  FingerprintRules rules;
  rules.headers = {"x-tag"};
  Req ab;
  ab.headers.push_back({"X-Tag", "a"});
  ab.headers.push_back({"X-Tag", "b"});
  Req ba;
  ba.headers.push_back({"X-Tag", "b"});
  ba.headers.push_back({"X-Tag", "a"});
  Req joined;
  joined.headers.push_back({"X-Tag", "ab"});
  EXPECT_NE(Fp(ab, rules), Fp(ba, rules));
  EXPECT_NE(Fp(ab, rules), Fp(joined, rules));
}

TEST(FingerprintTest, FramingPreventsConcatenationCollisions) {
  std::set<std::string> seen;
  auto add = [&](std::string method, std::string route, std::string target, std::string body) {
    Req r;
    r.method = std::move(method);
    r.route = std::move(route);
    r.target = std::move(target);
    r.headers = {{"Content-Type", "text/plain"}};
    r.body = std::move(body);
    seen.insert(Fp(r));
  };
  add("POST", "ab", "/c", "d");
  add("POS", "Tab", "/c", "d");
  add("POST", "a", "b/c", "d");
  add("POST", "ab", "/", "cd");
  add("POST", "ab", "/cd", "");
  EXPECT_EQ(seen.size(), 5u);

  FingerprintRules rules;
  rules.headers = {"a", "b"};
  Req one;
  one.headers = {{"a", "xy"}};
  Req two;
  two.headers = {{"a", "x"}, {"b", "y"}};
  Req three;
  three.headers = {{"b", "xy"}};
  EXPECT_NE(Fp(one, rules), Fp(two, rules));
  EXPECT_NE(Fp(one, rules), Fp(three, rules));
}

TEST(FingerprintTest, CanonicalJsonIgnoresKeyOrderAndSpacing) {
  Req a;
  a.body = R"({"amount":100,"currency":"eur"})";
  Req b;
  b.body = "{\n  \"currency\" : \"eur\",\t\"amount\": 100 }";
  EXPECT_EQ(Fp(a), Fp(b));
}

TEST(FingerprintTest, RawModeCountsBytes) {
  FingerprintRules rules;
  rules.json = JsonMode::kRaw;
  Req a;
  Req b;
  b.body = R"({"currency":"eur","amount":100})";
  EXPECT_NE(Fp(a, rules), Fp(b, rules));
}

TEST(FingerprintTest, NonJsonContentTypeCountsBytes) {
  Req a;
  a.headers = {{"Content-Type", "text/plain"}};
  Req b = a;
  b.body = R"({"currency":"eur","amount":100})";
  EXPECT_NE(Fp(a), Fp(b));
  Req none;
  none.headers.clear();
  Req none_b = none;
  none_b.body = b.body;
  EXPECT_NE(Fp(none), Fp(none_b));
}

TEST(FingerprintTest, PlusJsonAndParametersAreJson) {
  Req a;
  a.headers = {{"content-type", "application/merge-patch+json; charset=utf-8"}};
  Req b = a;
  b.body = R"({ "currency":"eur", "amount":100 })";
  EXPECT_EQ(Fp(a), Fp(b));
  EXPECT_TRUE(IsJsonContentType("application/json"));
  EXPECT_TRUE(IsJsonContentType("Application/JSON; charset=utf-8"));
  EXPECT_TRUE(IsJsonContentType("application/vnd.api+json"));
  EXPECT_TRUE(IsJsonContentType(" application/json "));
  EXPECT_FALSE(IsJsonContentType("text/plain"));
  EXPECT_FALSE(IsJsonContentType("application/jsonx"));
  EXPECT_FALSE(IsJsonContentType("application/+json"));
  EXPECT_FALSE(IsJsonContentType("json"));
  EXPECT_FALSE(IsJsonContentType(""));
  // A list on one line is two values, as two lines are.
  EXPECT_FALSE(IsJsonContentType("text/plain, application/ld+json"));
  EXPECT_FALSE(IsJsonContentType("application/json, text/plain"));
}

// Under two Content-Type lines an upstream may go by the one that is not
// JSON: the body's bytes count as they are.
TEST(FingerprintTest, TwoContentTypeLinesCountTheBytes) {
  Req a;
  a.headers = {{"Content-Type", "application/json"}};
  a.body = R"({"currency":"eur","amount":100})";
  Req b = a;
  b.body = R"({"amount":100,"currency":"eur"})";
  EXPECT_EQ(Fp(a), Fp(b));
  a.headers.push_back({"Content-Type", "text/plain"});
  b.headers = a.headers;
  EXPECT_NE(Fp(a), Fp(b));
}

TEST(FingerprintTest, InvalidJsonFallsBackToRawBytes) {
  Req a;
  a.body = R"({"amount":100,)";
  Req b;
  b.body = R"({"amount":100 ,)";
  Req c = a;
  EXPECT_NE(Fp(a), Fp(b));
  EXPECT_EQ(Fp(a), Fp(c));
  // The same invalid bytes give the same fingerprint whatever the mode.
  FingerprintRules raw;
  raw.json = JsonMode::kRaw;
  EXPECT_EQ(Fp(a), Fp(a, raw));
}

TEST(CanonicalJsonTest, SortsKeysRecursivelyAndDropsWhitespace) {
  EXPECT_EQ(Canon(R"( { "b" : [ 1 , { "d":1, "c":2 } ], "a" : null } )"),
            R"({"a":null,"b":[1,{"c":2,"d":1}]})");
  EXPECT_EQ(Canon("[]"), "[]");
  EXPECT_EQ(Canon("{}"), "{}");
  EXPECT_EQ(Canon(" true "), "true");
  EXPECT_EQ(Canon("\"x\""), "\"x\"");
}

TEST(CanonicalJsonTest, ArrayOrderCounts) { EXPECT_NE(Canon("[1,2]"), Canon("[2,1]")); }

TEST(CanonicalJsonTest, KeysSortByCodePoint) {
  EXPECT_EQ(Canon(R"({"b":1,"B":2,"a":3,"é":4,"aa":5})"), R"({"B":2,"a":3,"aa":5,"b":1,"é":4})");
}

TEST(CanonicalJsonTest, NumbersCompareByValue) {
  EXPECT_EQ(Canon("1"), "1");
  EXPECT_EQ(Canon("1.0"), "1");
  EXPECT_EQ(Canon("1e0"), "1");
  EXPECT_EQ(Canon("1E+0"), "1");
  EXPECT_EQ(Canon("10e-1"), "1");
  EXPECT_EQ(Canon("0.1e1"), "1");
  EXPECT_EQ(Canon("100"), "100");
  EXPECT_EQ(Canon("1e2"), "100");
  EXPECT_EQ(Canon("-0"), "0");
  EXPECT_EQ(Canon("-0.0e5"), "0");
  EXPECT_EQ(Canon("1.5"), "15e-1");
  EXPECT_EQ(Canon("15e-1"), "15e-1");
  EXPECT_EQ(Canon("0.15e1"), "15e-1");
  EXPECT_EQ(Canon("-0.0025"), "-25e-4");
  EXPECT_EQ(Canon("1e30"), "1e30");
  EXPECT_EQ(Canon("123456789012345678901"), "123456789012345678901");
  EXPECT_EQ(Canon("1234567890123456789012"), "1234567890123456789012e0");
  EXPECT_EQ(Canon("1e20"), "100000000000000000000");
  EXPECT_EQ(Canon("1e21"), "1e21");
  EXPECT_EQ(Canon("1e400"), "1e400");
  EXPECT_EQ(Canon(R"({"a":1.0})"), Canon(R"({"a":1})"));
}

TEST(CanonicalJsonTest, NumbersAreExactNotRoundedThroughDouble) {
  EXPECT_NE(Canon("9007199254740993"), Canon("9007199254740992"));
  EXPECT_NE(Canon("0.10000000000000000001"), Canon("0.1"));
  EXPECT_NE(Canon("18446744073709551616"), Canon("18446744073709551617"));
  EXPECT_NE(Canon("1"), Canon("-1"));
  EXPECT_NE(Canon("1"), Canon("\"1\""));
}

TEST(CanonicalJsonTest, HugeExponentKeepsLiteral) {
  EXPECT_EQ(CanonicalJsonNumber("1e9999999999999999"), "~1e9999999999999999");
  EXPECT_EQ(CanonicalJsonNumber("1e000000000000000000001"), "10");
}

TEST(CanonicalJsonTest, UnicodeEscapesCompareByValue) {
  EXPECT_EQ(Canon(R"("\u00e9")"), Canon("\"\xc3\xa9\""));
  EXPECT_EQ(Canon(R"({"caf\u00e9":1})"), Canon("{\"caf\xc3\xa9\":1}"));
  EXPECT_EQ(Canon(R"("\ud83d\ude00")"), Canon("\"\xf0\x9f\x98\x80\""));
  EXPECT_EQ(Canon(R"("\/")"), Canon(R"("/")"));
  EXPECT_EQ(Canon(R"("\u0041")"), "\"A\"");
}

TEST(CanonicalJsonTest, EscapesOnlyWhatMustBe) {
  EXPECT_EQ(Canon(R"("a\"b\\c\n\t\u0001")"), R"("a\"b\\c\u000a\u0009\u0001")");
  EXPECT_EQ(Canon(R"("\n")"), Canon(R"("\u000A")"));
}

// Strings are scanned eight bytes at a time; a character that must be
// escaped is found at every offset, in keys and values, beside UTF-8 bytes.
TEST(CanonicalJsonTest, EscapesAtEveryOffsetOfLongStrings) {
  const std::vector<std::pair<std::string, std::string>> specials = {
      {"\\\"", "\\\""}, {"\\\\", "\\\\"}, {"\\u0001", "\\u0001"}, {"\\u001f", "\\u001f"},
      {"\\n", "\\u000a"}, {"\xc3\xa9", "\xc3\xa9"}, {"\x7f", "\x7f"}, {" ", " "}};
  for (const auto& [in, out] : specials) {
    for (std::size_t at = 0; at <= 19; ++at) {
      const std::string before(at, 'a');
      const std::string after(19 - at, 'z');
      const std::string text = before + in + after;
      const std::string want = before + out + after;
      EXPECT_EQ(Canon("\"" + text + "\""), "\"" + want + "\"") << in << " at " << at;
      EXPECT_EQ(Canon("{\"" + text + "\":\"" + text + "\"}"),
                "{\"" + want + "\":\"" + want + "\"}")
          << in << " at " << at;
    }
  }
}

// Strings written as they came (a view of the input, no escape in them) and
// strings the parser rebuilt (escapes decoded, long ones handed over in
// pieces) must come out the same: quoted, with exactly the characters that
// must be escaped escaped, in keys and in values, in objects that are
// reordered and in objects that are not.
TEST(CanonicalJsonTest, LongStringsInPiecesAndAsTheyCame) {
  // In JSON: <n × e> \\ \u00e9 \"   Canonical: <n × e> \\ é \"
  const std::string escaped_suffix_in = R"(\\\u00e9\")";
  const std::string escaped_suffix_out = "\\\\\xc3\xa9\\\"";
  for (const std::size_t n : {std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{9000},
                              std::size_t{70000}}) {
    const std::string plain(n, 'p');
    const std::string escaped_in = std::string(n, 'e') + escaped_suffix_in;
    const std::string escaped_out = std::string(n, 'e') + escaped_suffix_out;
    const auto q = [](const std::string& s) { return "\"" + s + "\""; };
    EXPECT_EQ(Canon(q(plain)), q(plain)) << n;
    EXPECT_EQ(Canon(q(escaped_in)), q(escaped_out)) << n;
    const std::string sorted = "{" + q(escaped_out) + ":" + q(plain) + "," + q("z" + plain) + ":" + q(escaped_out) + "}";
    // Keys out of order ("z…" sorts after "e…"): the object is rebuilt.
    EXPECT_EQ(Canon("{" + q("z" + plain) + ":" + q(escaped_in) + "," + q(escaped_in) + ":" + q(plain) + "}"), sorted)
        << n;
    // Keys in order: the object is written once, as it is parsed.
    EXPECT_EQ(Canon("{" + q(escaped_in) + ":" + q(plain) + "," + q("z" + plain) + ":" + q(escaped_in) + "}"), sorted)
        << n;
  }
}

TEST(CanonicalJsonTest, RepeatedKeysKeepTheLast) {
  EXPECT_EQ(Canon(R"({"a":1,"b":2,"a":3})"), R"({"a":3,"b":2})");
  EXPECT_EQ(Canon(R"({"a":1,"a":3})"), Canon(R"({"a":3})"));
}

TEST(CanonicalJsonTest, RejectsInvalid) {
  EXPECT_FALSE(CanonicalJson("").ok());
  EXPECT_FALSE(CanonicalJson("{").ok());
  EXPECT_FALSE(CanonicalJson("{} x").ok());
  EXPECT_FALSE(CanonicalJson("[1,]").ok());
  EXPECT_FALSE(CanonicalJson("01").ok());
  EXPECT_FALSE(CanonicalJson("\"\xff\"").ok());
  EXPECT_FALSE(CanonicalJson("/* c */ 1").ok());
  EXPECT_FALSE(CanonicalJson(std::string(100, '[') + std::string(100, ']')).ok());
  EXPECT_TRUE(CanonicalJson(std::string(60, '[') + std::string(60, ']')).ok());
}

TEST(CanonicalJsonTest, SameDocumentDifferentValuesDiffer) {
  EXPECT_NE(Canon(R"({"a":1})"), Canon(R"({"a":"1"})"));
  EXPECT_NE(Canon(R"({"a":null})"), Canon(R"({})"));
  EXPECT_NE(Canon(R"({"a":[]})"), Canon(R"({"a":{}})"));
  EXPECT_NE(Canon(R"({"a":true})"), Canon(R"({"a":"true"})"));
  EXPECT_NE(Canon(R"(["a,b"])"), Canon(R"(["a","b"])"));
}

// Random documents, written with shuffled keys, random spacing and needless
// escapes, against a reference canonical form computed from the parsed tree
// (keys sorted bytewise, only '"', '\\' and control characters escaped).
class RandomDocument {
 public:
  explicit RandomDocument(unsigned seed) : rng_(seed) {}

  // Appends a random value of at most `depth` levels as messy JSON text.
  void Value(std::string* out, int depth) {
    const int kind = Pick(depth > 0 ? 7 : 4);
    Space(out);
    switch (kind) {
      case 0: out->append(std::to_string(static_cast<long long>(rng_() % 2000001) - 1000000)); break;
      case 1: String(out, Text()); break;
      case 2: out->append(Pick(2) == 0 ? "true" : "false"); break;
      case 3: out->append("null"); break;
      case 4:
      case 5: Object(out, depth - 1); break;
      default: Array(out, depth - 1); break;
    }
    Space(out);
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<unsigned>(n)); }
  void Space(std::string* out) {
    static const char* const kSpaces[] = {"", "", "", " ", "\n", "\t ", "\r\n  "};
    out->append(kSpaces[Pick(7)]);
  }
  std::string Text() {
    static const std::vector<std::string> kTexts = {
        "", "a", "b", "aa", "B", "z", "key", "keys", "ke", "\xc3\xa9", "\xf0\x9f\x98\x80", "a\"b",
        "a\\b", "tab\there", "\x01", "/path/", "zzzzzzzzzzzzzzzzzzzzzzzz", "0", "10", "9"};
    return kTexts[static_cast<std::size_t>(Pick(static_cast<int>(kTexts.size())))];
  }
  // Writes `s` as a JSON string, escaping more than needed at random.
  void String(std::string* out, const std::string& s) {
    out->push_back('"');
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      char buf[8];
      if (c == '"' || c == '\\') {
        out->push_back('\\');
        out->push_back(c);
      } else if (u < 0x20 || (u < 0x80 && Pick(8) == 0)) {
        std::snprintf(buf, sizeof buf, "\\u%04X", u);
        out->append(buf);
      } else if (c == '/' && Pick(2) == 0) {
        out->append("\\/");
      } else {
        out->push_back(c);
      }
    }
    out->push_back('"');
  }
  void Object(std::string* out, int depth) {
    std::vector<std::string> keys;
    for (int n = Pick(6); n > 0; --n) {
      std::string k = Text();
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(std::move(k));
    }
    out->push_back('{');
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) out->push_back(',');
      Space(out);
      String(out, keys[i]);
      Space(out);
      out->push_back(':');
      Value(out, depth);
    }
    Space(out);
    out->push_back('}');
  }
  void Array(std::string* out, int depth) {
    out->push_back('[');
    for (int i = 0, n = Pick(5); i < n; ++i) {
      if (i > 0) out->push_back(',');
      Value(out, depth);
    }
    Space(out);
    out->push_back(']');
  }

  std::mt19937 rng_;
};

void ReferenceQuoted(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out->append(buf);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

void ReferenceCanonical(std::string* out, const boost::json::value& v) {
  if (v.is_object()) {
    std::vector<std::pair<std::string_view, const boost::json::value*>> members;
    for (const auto& m : v.get_object()) members.emplace_back(std::string_view(m.key()), &m.value());
    std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    out->push_back('{');
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out->push_back(',');
      ReferenceQuoted(out, members[i].first);
      out->push_back(':');
      ReferenceCanonical(out, *members[i].second);
    }
    out->push_back('}');
  } else if (v.is_array()) {
    out->push_back('[');
    bool first = true;
    for (const auto& e : v.get_array()) {
      if (!first) out->push_back(',');
      first = false;
      ReferenceCanonical(out, e);
    }
    out->push_back(']');
  } else if (v.is_string()) {
    ReferenceQuoted(out, std::string_view(v.get_string()));
  } else if (v.is_int64()) {
    out->append(std::to_string(v.get_int64()));
  } else if (v.is_bool()) {
    out->append(v.get_bool() ? "true" : "false");
  } else {
    out->append("null");
  }
}

TEST(CanonicalJsonTest, RandomDocumentsMatchTheReferenceForm) {
  for (unsigned seed = 1; seed <= 3000; ++seed) {
    RandomDocument gen(seed);
    std::string text;
    gen.Value(&text, 4);
    std::string want;
    ReferenceCanonical(&want, boost::json::parse(text));
    const std::string got = Canon(text);
    ASSERT_EQ(got, want) << "seed " << seed << ": " << text;
    ASSERT_EQ(Canon(got), got) << "seed " << seed;
    // Inside an object, an earlier member with the same key does not count.
    const std::string wrapped = R"({"k":)" + text + R"(,"a":[1,{"y":2,"x":1}],"k":)" + text + "}";
    const std::string shadowed = R"({"k":[true,{"b":1,"a":2}],"a":[1,{"y":2,"x":1}],"k":)" + text + "}";
    ASSERT_EQ(Canon(wrapped), Canon(shadowed)) << "seed " << seed;
    ASSERT_EQ(Canon(wrapped), R"({"a":[1,{"x":1,"y":2}],"k":)" + want + "}") << "seed " << seed;
  }
}

// Deep documents whose every object is out of order: each level is put in
// order once, and the result is the same as for the document written sorted.
TEST(CanonicalJsonTest, DeepUnsortedDocuments) {
  std::string unsorted = "0";
  std::string sorted = "0";
  for (int level = 0; level < 60; ++level) {
    unsorted = R"({"z":")" + std::string(level, 'x') + R"(","m":)" + unsorted + R"(,"a":[)" + std::to_string(level) + "]}";
    sorted = R"({"a":[)" + std::to_string(level) + R"(],"m":)" + sorted + R"(,"z":")" + std::string(level, 'x') + "\"}";
  }
  EXPECT_EQ(Canon(unsorted), sorted);
}

TEST(JsonPointerTest, Validity) {
  EXPECT_TRUE(IsValidJsonPointer(""));
  EXPECT_TRUE(IsValidJsonPointer("/"));
  EXPECT_TRUE(IsValidJsonPointer("/a/b"));
  EXPECT_TRUE(IsValidJsonPointer("/a~0b/c~1d"));
  EXPECT_FALSE(IsValidJsonPointer("a"));
  EXPECT_FALSE(IsValidJsonPointer("/a~2"));
  EXPECT_FALSE(IsValidJsonPointer("/a~"));
}

TEST(JsonPointerTest, SelectsFields) {
  const std::string doc =
      R"({"amount":1.0,"meta":{"a/b":1,"m~n":2,"":3},"items":[{"id":"x"},{"id":"y"}],"n":null})";
  auto fields = CanonicalJsonFields(
      doc, {"/amount", "/meta/a~1b", "/meta/m~0n", "/meta/", "/items/1/id", "/items/2",
            "/items/-", "/items/01", "/n", "/missing", "", "/amount/x", "bad"});
  ASSERT_TRUE(fields.ok());
  const auto& f = *fields;
  ASSERT_EQ(f.size(), 13u);
  EXPECT_EQ(f[0], "1");
  EXPECT_EQ(f[1], "1");
  EXPECT_EQ(f[2], "2");
  EXPECT_EQ(f[3], "3");
  EXPECT_EQ(f[4], "\"y\"");
  EXPECT_EQ(f[5], std::nullopt);
  EXPECT_EQ(f[6], std::nullopt);
  EXPECT_EQ(f[7], std::nullopt);
  EXPECT_EQ(f[8], "null");
  EXPECT_EQ(f[9], std::nullopt);
  EXPECT_EQ(f[10], Canon(doc));
  EXPECT_EQ(f[11], std::nullopt);
  EXPECT_EQ(f[12], std::nullopt);
}

TEST(JsonPointerTest, SelectsCanonicalSubtrees) {
  auto fields = CanonicalJsonFields(R"({"x":{ "b":2, "a":[1.0, {"d":1,"c":2}] }})", {"/x"});
  ASSERT_TRUE(fields.ok());
  EXPECT_EQ((*fields)[0], R"({"a":[1,{"c":2,"d":1}],"b":2})");
}

TEST(JsonPointerTest, RepeatedKeyLastWinsInsideFields) {
  auto fields = CanonicalJsonFields(R"({"a":{"b":1},"a":{"c":2}})", {"/a/b", "/a/c", "/a"});
  ASSERT_TRUE(fields.ok());
  EXPECT_EQ((*fields)[0], std::nullopt);
  EXPECT_EQ((*fields)[1], "2");
  EXPECT_EQ((*fields)[2], R"({"c":2})");
}

TEST(FingerprintTest, JsonFieldsLimitTheBody) {
  FingerprintRules rules;
  rules.json_fields = {"/amount", "/currency"};
  Req a;
  a.body = R"({"amount":100,"currency":"eur","note":"first"})";
  Req b;
  b.body = R"({"note":"second","currency":"eur","amount":100.0})";
  Req c;
  c.body = R"({"amount":200,"currency":"eur","note":"first"})";
  EXPECT_EQ(Fp(a, rules), Fp(b, rules));
  EXPECT_NE(Fp(a, rules), Fp(c, rules));
  EXPECT_NE(Fp(a), Fp(b));
}

TEST(FingerprintTest, JsonFieldsAbsentDiffersFromNull) {
  FingerprintRules rules;
  rules.json_fields = {"/amount", "/currency"};
  Req absent;
  absent.body = R"({"amount":100})";
  Req null;
  null.body = R"({"amount":100,"currency":null})";
  Req string_null;
  string_null.body = R"({"amount":100,"currency":"null"})";
  EXPECT_NE(Fp(absent, rules), Fp(null, rules));
  EXPECT_NE(Fp(null, rules), Fp(string_null, rules));
}

TEST(FingerprintTest, JsonFieldsOrderOfPointersCounts) {
  FingerprintRules ab;
  ab.json_fields = {"/a", "/b"};
  FingerprintRules ba;
  ba.json_fields = {"/b", "/a"};
  Req r;
  r.body = R"({"a":1,"b":1})";
  // The pointers are part of the fingerprint: a config change is a new key space.
  EXPECT_NE(Fp(r, ab), Fp(r, ba));
}

TEST(FingerprintTest, JsonFieldsWithInvalidBodyFallBackToRaw) {
  FingerprintRules rules;
  rules.json_fields = {"/amount"};
  Req a;
  a.body = R"({"amount":100)";
  Req b;
  b.body = R"({"amount":100 )";
  EXPECT_NE(Fp(a, rules), Fp(b, rules));
}

}  // namespace
}  // namespace idemgate::core
