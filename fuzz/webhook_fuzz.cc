// Webhook translation (SPEC §7, webhooks::Translate) for every provider and
// four `generic` shapes. The first byte picks the provider; every input is
// then used twice:
//  - as a hostile request: the rest is "<url>\n<name>: <value>\n...\n\n<body>",
//    verified under a fixed secret. Checked: the outcome, key and detail agree
//    (a key exactly when kOk, a detail otherwise that never holds the secret);
//    a key carries the provider's prefix and a non-empty id; and for the
//    providers that sign the body alone, kOk only when the header holds the
//    HMAC this target computes itself with OpenSSL.
//  - as the choices for a request signed correctly here (HMACs, hex, base64
//    and form encoding written in this file and fuzz_reference.h, not taken
//    from src/): id, body, secret, timestamp offset, header name case, decoy
//    signatures, default port. Checked: it translates to exactly the
//    expected key (or is refused exactly when its timestamp is outside the
//    tolerance, or its id is repeated); and a changed body, id, timestamp or
//    URL, another secret, a missing or repeated signature header all make it
//    invalid.

#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/key.h"
#include "fuzz_input.h"
#include "fuzz_reference.h"
#include "fuzz_target.h"
#include "webhooks/providers.h"

namespace {

namespace webhooks = idemgate::webhooks;
using idemgate::fuzz::Base64;
using idemgate::fuzz::Hex;
using idemgate::fuzz::Hmac;
using idemgate::fuzz::JsonString;
using idemgate::fuzz::LenientBase64Decode;
using idemgate::fuzz::Reader;
using webhooks::GenericSpec;
using webhooks::HeaderField;
using webhooks::Provider;
using webhooks::Translation;
using webhooks::WebhookRequest;
using Outcome = Translation::Outcome;

constexpr std::int64_t kNow = 1700000000;
// The hostile requests' secrets: long enough that no detail holds them by chance.
constexpr std::string_view kSecret = "fuzz-secret-7d1e4f0a9b2c";
constexpr std::string_view kStandardSecret =
    "whsec_ZnV6ei1zZWNyZXQtN2QxZTRmMGE5YjJj";  // base64 of kSecret

// ---------------------------------------------------------------------------
// Encodings and MACs, written here (and in fuzz_reference.h) so that they check src/ rather than
// echo it.

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  FUZZ_CHECK(EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) == 1);
  return Hex(std::string_view(reinterpret_cast<const char*>(digest), size), false);
}

// Every byte but [A-Za-z0-9] percent-escaped, so the decoded form is exactly `s`.
std::string FormEscape(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.append(Hex(std::string_view(&c, 1), c & 1));  // either case of hex digit
    }
  }
  return out;
}

// `name` with the letters chosen by `bits` upper-cased: providers match header names in any case.
std::string MixCase(std::string_view name, std::uint32_t bits) {
  std::string out(name);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (((bits >> (i % 32)) & 1) && out[i] >= 'a' && out[i] <= 'z')
      out[i] = static_cast<char>(out[i] - 32);
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           const auto lower = [](char c) {
             return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
           };
           return lower(x) == lower(y);
         });
}

// The trimmed value of the one header `name`, or nothing when it is absent or repeated.
std::optional<std::string_view> OnlyHeader(const std::vector<HeaderField>& headers,
                                           std::string_view name) {
  std::optional<std::string_view> found;
  int count = 0;
  for (const HeaderField& h : headers) {
    if (IEquals(h.name, name) && count++ == 0) found = Trim(h.value);
  }
  if (count != 1) return std::nullopt;
  return found;
}

// ---------------------------------------------------------------------------
// Providers and generic shapes

struct Choice {
  Provider provider;
  const GenericSpec* spec;  // kGeneric only
  std::string_view prefix;  // of every key; empty for generic
};

GenericSpec Spec(std::string header, GenericSpec::Algorithm algorithm,
                 GenericSpec::Encoding encoding, std::string prefix) {
  GenericSpec spec;
  spec.header = std::move(header);
  spec.algorithm = algorithm;
  spec.encoding = encoding;
  spec.prefix = std::move(prefix);
  return spec;
}

const std::vector<GenericSpec>& GenericSpecs() {
  static const std::vector<GenericSpec> specs = [] {
    using A = GenericSpec::Algorithm;
    using E = GenericSpec::Encoding;
    std::vector<GenericSpec> s;
    s.push_back(Spec("X-Signature", A::kSha256, E::kHex, "sha256="));
    s.back().id_header = "X-Event-Id";
    s.push_back(Spec("X-Sig", A::kSha1, E::kBase64, ""));
    s.back().id_pointer = "/data/id";
    s.push_back(Spec("X-Hook-Signature", A::kSha256, E::kBase64, "v1="));
    s.back().id_form_fields = {"event", "seq"};
    s.push_back(Spec("Signature", A::kSha1, E::kHex, ""));
    s.back().id_pointer = "/id";
    return s;
  }();
  return specs;
}

// The first byte, read as a digit ('0' stripe ... '9') modulo 10.
Choice ChoiceOf(std::uint8_t byte) {
  byte = static_cast<std::uint8_t>((byte + 2) % 10);
  switch (byte) {
    case 0:
      return {Provider::kStripe, nullptr, "stripe-"};
    case 1:
      return {Provider::kGitHub, nullptr, "github-"};
    case 2:
      return {Provider::kTwilio, nullptr, "twilio-"};
    case 3:
      return {Provider::kTwilioEventStreams, nullptr, "twilio-"};
    case 4:
      return {Provider::kStandardWebhooks, nullptr, "webhook-"};
    case 5:
      return {Provider::kGeneric, nullptr, ""};  // no settings: always refused
    default:
      return {Provider::kGeneric, &GenericSpecs()[byte - 6], ""};
  }
}

const EVP_MD* MdOf(GenericSpec::Algorithm algorithm) {
  return algorithm == GenericSpec::Algorithm::kSha1 ? EVP_sha1() : EVP_sha256();
}

// What every translation promises, whatever the input. `secret` (when not empty) must not be in a
// detail.
void CheckShape(const Translation& t, const Choice& choice, std::string_view secret) {
  if (t.outcome == Outcome::kOk) {
    FUZZ_CHECK(t.detail.empty());
    FUZZ_CHECK(t.key.size() > choice.prefix.size() && t.key.starts_with(choice.prefix));
    // The gateway validates the key against the route's rules (webhook_stage.cc) and refuses one
    // that fails; the check itself must take anything.
    (void)idemgate::core::ValidateRawKey(t.key, idemgate::core::KeyRules{});
  } else {
    FUZZ_CHECK(t.outcome == Outcome::kSignatureInvalid || t.outcome == Outcome::kNoId);
    FUZZ_CHECK(t.key.empty());
    FUZZ_CHECK(!t.detail.empty());
    if (!secret.empty()) FUZZ_CHECK(t.detail.find(secret) == std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// Hostile requests

void Hostile(const Choice& choice, std::string_view text) {
  WebhookRequest request;
  request.now_unix_seconds = kNow;
  std::size_t eol = text.find('\n');
  request.url = text.substr(0, eol);
  text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
  while (!text.empty()) {
    eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.empty()) break;
    const std::size_t colon = line.find(':');
    request.headers.push_back({line.substr(0, colon), colon == std::string_view::npos
                                                          ? std::string_view()
                                                          : line.substr(colon + 1)});
  }
  request.body = text;

  const std::string_view secret =
      choice.provider == Provider::kStandardWebhooks ? kStandardSecret : kSecret;
  const Translation t = webhooks::Translate(choice.provider, choice.spec, secret, request);
  CheckShape(t, choice, kSecret);
  CheckShape(t, choice, kStandardSecret.substr(6));
  if (t.outcome == Outcome::kSignatureInvalid) return;

  // Verified: the signature must really be there.
  if (choice.provider == Provider::kGitHub) {
    const auto header = OnlyHeader(request.headers, "X-Hub-Signature-256");
    FUZZ_CHECK(header &&
               IEquals(*header, "sha256=" + Hex(Hmac(EVP_sha256(), kSecret, request.body), false)));
    if (t.outcome == Outcome::kOk) {
      FUZZ_CHECK(t.key ==
                 "github-" +
                     std::string(OnlyHeader(request.headers, "X-GitHub-Delivery").value_or("")));
    }
  } else if (choice.provider == Provider::kGeneric) {
    FUZZ_CHECK(choice.spec != nullptr);
    const GenericSpec& spec = *choice.spec;
    const auto header = OnlyHeader(request.headers, spec.header);
    FUZZ_CHECK(header && header->starts_with(spec.prefix));
    const std::string mac = Hmac(MdOf(spec.algorithm), kSecret, request.body);
    const std::string_view sent = header->substr(spec.prefix.size());
    FUZZ_CHECK(spec.encoding == GenericSpec::Encoding::kHex ? IEquals(sent, Hex(mac, false))
                                                            : LenientBase64Decode(sent) == mac);
  } else if (choice.provider == Provider::kStandardWebhooks && t.outcome == Outcome::kOk) {
    FUZZ_CHECK(t.key.find('.') == std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// Correctly signed requests

// 1..`max` visible ASCII characters other than `avoid`, from the input's bytes.
std::string Id(Reader& in, std::size_t max, char avoid) {
  const std::size_t n = 1 + in.Byte() % max;
  std::string out;
  for (const char c : in.Bytes(n)) {
    char v = static_cast<char>(0x21 + static_cast<unsigned char>(c) % 94);
    out.push_back(v == avoid ? '_' : v);
  }
  if (out.empty()) out = "0";
  return out;
}

// The key of a Twilio messaging request whose signed text (the URL as signed,
// then the form's names and values run together) is `text`: read from that
// text, so that every cut of it into URL and fields gives one key. The one "MessageSid" (not inside
// "SmsMessageSid") followed by two capitals and lower-case hex digits, and
// the one "MessageStatus" (else "SmsStatus") followed by lower-case letters
// or '_'; anything else open is "twilio-signed-" + the text's SHA-256.
std::string TwilioKeyOfSignedText(const std::string& text) {
  const auto count = [&](const std::string& name, std::size_t* first) {
    std::size_t n = 0;
    for (std::size_t at = 0; (at = text.find(name, at)) != std::string::npos; ++at) {
      if (name == "MessageSid" && at >= 3 && text.compare(at - 3, 3, "Sms") == 0) continue;
      if (n++ == 0) *first = at;
    }
    return n;
  };
  const std::string whole = "twilio-signed-" + Sha256Hex(text);
  std::size_t sid_at = 0;
  if (count("MessageSid", &sid_at) != 1) return whole;
  std::size_t p = sid_at + 10;
  const auto upper = [&](std::size_t i) { return i < text.size() && text[i] >= 'A' && text[i] <= 'Z'; };
  if (!upper(p) || !upper(p + 1)) return whole;
  std::size_t end = p + 2;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || (text[end] >= 'a' && text[end] <= 'f'))) {
    ++end;
  }
  if (end == p + 2) return whole;
  std::string key = "twilio-" + text.substr(p, end - p);
  std::size_t status_at = 0;
  std::string name = "MessageStatus";
  std::size_t statuses = count(name, &status_at);
  if (statuses == 0) {
    name = "SmsStatus";
    statuses = count(name, &status_at);
  }
  if (statuses > 1) return whole;
  if (statuses == 1) {
    std::size_t from = status_at + name.size();
    std::size_t to = from;
    while (to < text.size() && ((text[to] >= 'a' && text[to] <= 'z') || text[to] == '_')) ++to;
    if (to == from) return whole;
    key += "-" + text.substr(from, to - from);
  }
  return key;
}

// A value of a key joined from several: '~' written "~7E" and '-' "~2D".
std::string Escaped(const std::string& value) {
  std::string out;
  for (const char c : value) {
    if (c == '~') {
      out += "~7E";
    } else if (c == '-') {
      out += "~2D";
    } else {
      out += c;
    }
  }
  return out;
}

// A signed request, the strings its views point into, and how to tamper with it.
struct Signed {
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::int64_t now = kNow;
  std::string secret;
  Outcome expected = Outcome::kOk;
  std::string key;                          // when expected is kOk
  std::string signature_header;             // its name, for dropping and repeating it
  bool body_signed = true;                  // every byte of `body` is signed
  std::vector<std::string> signed_headers;  // headers whose values are signed (id, timestamp)

  Translation Run(const Choice& choice) const {
    WebhookRequest request;
    request.url = url;
    for (const auto& [name, value] : headers) request.headers.push_back({name, value});
    request.body = body;
    request.now_unix_seconds = now;
    return webhooks::Translate(choice.provider, choice.spec, secret, request);
  }
};

// Fills `s` for `choice` from the input; false when the choice has nothing to sign (generic without
// settings).
bool Build(const Choice& choice, Reader& in, Signed& s) {
  const std::uint8_t flags = in.Byte();
  const std::uint32_t case_bits = in.U32();
  const auto header = [&](std::string_view name, std::string value) {
    s.headers.emplace_back(MixCase(name, case_bits), std::move(value));
  };
  // Within the tolerance for 7 in 8 inputs, anywhere up to 2 × 300 s away otherwise.
  const std::int64_t raw_offset = static_cast<std::int16_t>(in.Word());
  const std::int64_t offset = (flags & 0x70) != 0 ? raw_offset % 301 : raw_offset % 601;
  const bool fresh = offset >= -300 && offset <= 300;
  const std::string t = std::to_string(kNow + offset);
  s.secret = std::string(in.Bytes(in.Byte() % 40));

  switch (choice.provider) {
    case Provider::kStripe: {
      const std::string id = Id(in, 40, 0);
      s.body = "{\"object\":\"event\",\"id\":" + JsonString(id) +
               ",\"data\":" + JsonString(in.Rest()) + "}";
      const std::string mac = Hex(Hmac(EVP_sha256(), s.secret, t + "." + s.body), flags & 1);
      // Decoys around the real v1: an older scheme's and another secret's.
      std::string value = (flags & 2) ? "v0=" + mac + ", t=" + t : "t=" + t;
      if (flags & 4)
        value += ",v1=" + Hex(Hmac(EVP_sha256(), s.secret + "old", t + "." + s.body), false);
      value += (flags & 8) ? " ,\tv1=" + mac : ",v1=" + mac;
      s.signature_header = "Stripe-Signature";
      header(s.signature_header, value);
      s.expected = fresh ? Outcome::kOk : Outcome::kSignatureInvalid;
      s.key = "stripe-" + id;
      return true;
    }
    case Provider::kGitHub: {
      const std::string id = Id(in, 40, 0);
      s.body = std::string(in.Rest());
      s.signature_header = "X-Hub-Signature-256";
      header(s.signature_header, "sha256=" + Hex(Hmac(EVP_sha256(), s.secret, s.body), flags & 1));
      header("X-GitHub-Delivery", (flags & 2) ? " " + id + "\t" : id);
      if (flags & 4) header("X-GitHub-Delivery", id);  // repeated: no id
      s.expected = (flags & 4) ? Outcome::kNoId : Outcome::kOk;
      s.key = "github-" + id;
      return true;
    }
    case Provider::kTwilio:
    case Provider::kTwilioEventStreams: {
      std::string id = Id(in, 34, 0);
      // Half the messaging sids are of Twilio's shape (two capitals, lower-case hex): the
      // others leave the key's reading open (the key of the signed text).
      if (choice.provider == Provider::kTwilio && (id[0] & 1)) id = "SM" + Hex(id, false);
      const std::string path = FormEscape(Id(in, 12, 0));
      // Signed with the default port written or not, sent the other way when flags & 2.
      const bool port = flags & 1;
      std::string signed_url = "https://example.com";
      signed_url += port ? ":443/hooks/" : "/hooks/";
      signed_url += path + "?q=" + std::to_string(flags);
      s.url = signed_url;
      if (flags & 2) {
        s.url = port ? "https://example.com/hooks/" : "https://example.com:443/hooks/";
        s.url += path + "?q=" + std::to_string(flags);
      }
      std::string suffix;
      std::string status;
      const bool sha_mode = flags & 4;
      if (sha_mode) {
        // Event Streams: a JSON body, its SHA-256 in the URL.
        s.body = std::string(in.Rest());
        const std::string digest = "&bodySHA256=" + Sha256Hex(s.body);
        signed_url += digest;
        s.url += digest;
        header("Content-Type", "application/json");
        if (choice.provider == Provider::kTwilio) {
          // Messaging: its id is in a form body, so the JSON one has none.
          s.expected = Outcome::kNoId;
        }
      } else {
        // A form: the signed text is every name and value, sorted; the values are percent-escaped.
        const std::string_view statuses[] = {"", "delivered", "sent", "failed"};
        status = std::string(statuses[(flags >> 4) & 3]);
        std::vector<std::pair<std::string, std::string>> fields = {
            {"MessageSid", id}, {"Body", std::string(in.Rest())}};
        if (!status.empty())
          fields.emplace_back((flags & 0x40) ? "SmsStatus" : "MessageStatus", status);
        if (flags & 0x80) std::reverse(fields.begin(), fields.end());
        for (const auto& [name, value] : fields) {
          if (!s.body.empty()) s.body += '&';
          s.body += FormEscape(name) + "=" + FormEscape(value);
        }
        std::sort(fields.begin(), fields.end());
        for (const auto& [name, value] : fields) suffix += name + value;
        header("Content-Type", (flags & 8) ? "Application/X-WWW-Form-Urlencoded; charset=utf-8"
                                           : "application/x-www-form-urlencoded");
        // Form bytes that decode to the same fields are signed alike (Twilio signs the decoded
        // form), so the body is tampered with only by the check's own field added below.
        s.body_signed = false;
      }
      s.signature_header = "X-Twilio-Signature";
      header(s.signature_header, Base64(Hmac(EVP_sha1(), s.secret, signed_url + suffix)));
      if (choice.provider == Provider::kTwilioEventStreams) {
        header("I-Twilio-Idempotency-Token", id);
        s.key = "twilio-" + id;
        if (!sha_mode) s.body_signed = false;
      } else {
        if (!sha_mode) s.key = TwilioKeyOfSignedText(signed_url + suffix);
      }
      return true;
    }
    case Provider::kStandardWebhooks: {
      const std::string id = Id(in, 40, '.');
      s.body = std::string(in.Rest());
      // The secret is base64 of its bytes, "whsec_" before it or not; an empty one is not a secret.
      const std::string key_bytes = s.secret.empty() ? std::string("k") : s.secret;
      s.secret = ((flags & 1) ? "" : "whsec_") + Base64(key_bytes);
      const std::string mac = Base64(Hmac(EVP_sha256(), key_bytes, id + "." + t + "." + s.body));
      const std::string prefix = (flags & 2) ? "svix-" : "webhook-";
      std::string signatures = "v1," + mac;
      if (flags & 4)
        signatures =
            "v1a," + mac + " v1," + Base64(Hmac(EVP_sha256(), "other", id)) + " " + signatures;
      if (flags & 8) signatures += " v2,AAAA";
      header(prefix + "id", id);
      header(prefix + "timestamp", t);
      s.signature_header = prefix + "signature";
      header(s.signature_header, signatures);
      s.signed_headers = {prefix + "id", prefix + "timestamp"};
      s.expected = fresh ? Outcome::kOk : Outcome::kSignatureInvalid;
      s.key = "webhook-" + id;
      return true;
    }
    case Provider::kGeneric: {
      if (choice.spec == nullptr) return false;
      const GenericSpec& spec = *choice.spec;
      const std::string id = Id(in, 40, 0);
      if (!spec.id_header.empty()) {
        s.body = std::string(in.Rest());
        header(spec.id_header, id);
        s.key = id;
      } else if (!spec.id_pointer.empty()) {
        std::string id_json = JsonString(id);
        s.key = id;
        if (flags & 2) {
          // An integer id, signed or not: the key is its decimal form.
          const std::uint32_t high = in.U32();
          const std::uint64_t n = static_cast<std::uint64_t>(high) << 32 | in.U32();
          s.key = (flags & 4) && (n >> 1) != 0 ? "-" + std::to_string(n >> 1) : std::to_string(n);
          id_json = s.key;
        }
        const std::string rest = JsonString(in.Rest());
        s.body = spec.id_pointer == "/id"
                     ? "{\"id\":" + id_json + ",\"other\":" + rest + "}"
                     : "{\"data\":{\"x\":" + rest + ",\"id\":" + id_json + "}}";
      } else {
        const std::string seq = Id(in, 8, 0);
        s.body = "event=" + FormEscape(id) + "&seq=" + FormEscape(seq) +
                 "&data=" + FormEscape(in.Rest());
        header("Content-Type", "application/x-www-form-urlencoded");
        // Two fields: '~' and '-' inside a value are escaped, so the joint
        // is the only bare '-' between them.
        s.key = Escaped(id) + "-" + Escaped(seq);
      }
      const std::string mac = Hmac(MdOf(spec.algorithm), s.secret, s.body);
      s.signature_header = spec.header;
      header(spec.header,
             spec.prefix + (spec.encoding == GenericSpec::Encoding::kHex ? Hex(mac, flags & 1)
                                                                         : Base64(mac)));
      return true;
    }
  }
  return false;
}

void CheckSigned(const Choice& choice, std::string_view data) {
  Reader in(data);
  Signed s;
  if (!Build(choice, in, s)) return;

  const Translation t = s.Run(choice);
  CheckShape(t, choice, {});  // the fuzz-chosen secret may be any short text, "X-Sig" too
  FUZZ_CHECK(t.outcome == s.expected);
  if (s.expected == Outcome::kOk) FUZZ_CHECK(t.key == s.key);
  if (s.expected == Outcome::kSignatureInvalid)
    return;  // stale: every tampering below would be refused anyway

  const auto refused = [&](const Signed& changed) {
    return changed.Run(choice).outcome == Outcome::kSignatureInvalid;
  };

  // Another secret.
  Signed other = s;
  other.secret = choice.provider == Provider::kStandardWebhooks ? "whsec_b3RoZXI=" : s.secret + "x";
  FUZZ_CHECK(refused(other));

  // The body changed: one byte (chosen by the body's own length), or a byte added to an empty one.
  if (s.body_signed) {
    Signed changed = s;
    if (changed.body.empty()) {
      changed.body = "x";
    } else {
      changed.body[changed.body.size() / 2] ^= 0x01;
    }
    FUZZ_CHECK(refused(changed));
  } else if (choice.provider == Provider::kTwilio ||
             choice.provider == Provider::kTwilioEventStreams) {
    // A form field added (twilio's bodySHA256 bodies are signed whole, above).
    Signed changed = s;
    changed.body += "&Extra=1";
    FUZZ_CHECK(refused(changed));
  }

  // The URL changed (Twilio signs it): one byte of its path.
  if (choice.provider == Provider::kTwilio || choice.provider == Provider::kTwilioEventStreams) {
    Signed changed = s;
    changed.url[changed.url.find("/hooks/") + 1] = 'H';
    FUZZ_CHECK(refused(changed));
  }

  // A signed header (id, timestamp) changed.
  for (const std::string& name : s.signed_headers) {
    Signed changed = s;
    for (auto& [n, value] : changed.headers) {
      if (IEquals(n, name)) value.back() = value.back() == '1' ? '2' : '1';
    }
    FUZZ_CHECK(refused(changed));
  }

  // The signature header missing, or there twice (even with the same value).
  Signed dropped = s;
  std::erase_if(dropped.headers,
                [&](const auto& h) { return IEquals(h.first, s.signature_header); });
  FUZZ_CHECK(refused(dropped));
  Signed twice = s;
  for (const auto& [name, value] : s.headers) {
    if (IEquals(name, s.signature_header)) twice.headers.emplace_back(name, value);
  }
  FUZZ_CHECK(refused(twice));
}

}  // namespace

IDEMGATE_FUZZ_TARGET(webhook) {
  if (size == 0) return 0;
  const Choice choice = ChoiceOf(data[0]);
  const std::string_view rest = idemgate::fuzz::AsView(data + 1, size - 1);
  Hostile(choice, rest);
  CheckSigned(choice, rest);
  return 0;
}
