#include "webhooks/providers.h"

#include "common/digest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// Every expected signature below was computed with the OpenSSL command line
// (the command is next to each constant), not with the code under test.
namespace idemgate::webhooks {
namespace {

using Outcome = Translation::Outcome;

WebhookRequest Request(std::string_view body, std::vector<HeaderField> headers, std::string_view url = "",
                       std::int64_t now = 0) {
  WebhookRequest request;
  request.url = url;
  request.headers = std::move(headers);
  request.body = body;
  request.now_unix_seconds = now;
  return request;
}

void ExpectKey(const Translation& t, std::string_view key) {
  EXPECT_EQ(t.outcome, Outcome::kOk) << t.detail;
  EXPECT_EQ(t.key, key);
}

void ExpectInvalid(const Translation& t) {
  EXPECT_EQ(t.outcome, Outcome::kSignatureInvalid) << t.key;
  EXPECT_TRUE(t.key.empty());
  EXPECT_FALSE(t.detail.empty());
}

void ExpectNoId(const Translation& t) {
  EXPECT_EQ(t.outcome, Outcome::kNoId) << t.key << t.detail;
  EXPECT_TRUE(t.key.empty());
  EXPECT_FALSE(t.detail.empty());
}

// ---------------------------------------------------------------------------
// Names

TEST(ProviderNameTest, RoundTripsEveryProvider) {
  for (const Provider p :
       {Provider::kStripe, Provider::kGitHub, Provider::kTwilio, Provider::kTwilioEventStreams, Provider::kGeneric,
        Provider::kStandardWebhooks}) {
    EXPECT_EQ(ProviderFromName(ProviderName(p)), p);
  }
  EXPECT_EQ(ProviderName(Provider::kStandardWebhooks), "standard_webhooks");
  EXPECT_EQ(ProviderName(Provider::kStripe), "stripe");
  EXPECT_EQ(ProviderName(Provider::kGitHub), "github");
  EXPECT_EQ(ProviderName(Provider::kTwilio), "twilio");
  EXPECT_EQ(ProviderName(Provider::kTwilioEventStreams), "twilio_event_streams");
  EXPECT_EQ(ProviderName(Provider::kGeneric), "generic");
}

TEST(ProviderNameTest, RejectsOtherNames) {
  for (const std::string_view name :
       {"", "Stripe", "GITHUB", "twilio-event-streams", "twilio_event_stream", " generic", "generic ", "hmac"}) {
    EXPECT_EQ(ProviderFromName(name), std::nullopt) << name;
  }
  EXPECT_EQ(ProviderFromName(std::string_view("stripe\0", 7)), std::nullopt);
}

// ---------------------------------------------------------------------------
// Standard Webhooks

// The example of the Standard Webhooks reference libraries' tests; checked with
// K=$(printf '%s' MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw | base64 -d | xxd -p | tr -d '\n')
// printf '%s' 'msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{"test": 2432232314}' |
//   openssl dgst -sha256 -mac HMAC -macopt hexkey:$K -binary | base64
constexpr std::string_view kSwSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view kSwId = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr std::int64_t kSwT = 1614265330;
constexpr std::string_view kSwBody = R"({"test": 2432232314})";
constexpr std::string_view kSwSig = "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
// The same content under the key "secret-key-for-idemgate-tests" (whsec_c2VjcmV0LWtleS1mb3ItaWRlbWdhdGUtdGVzdHM=).
constexpr std::string_view kSwOtherSig = "/Q7qALNl83mSPKY3mWw2pSz4OSS+9OqAJw5Ahetf78g=";

Translation StandardWebhooks(std::vector<HeaderField> headers, std::string_view body = kSwBody,
                             std::int64_t now = kSwT, std::string_view secret = kSwSecret) {
  return Translate(Provider::kStandardWebhooks, nullptr, secret, Request(body, std::move(headers), "", now));
}

// The three headers under `prefix` ("webhook-", "svix-" or "Webhook-");
// `signature` must outlive them.
std::vector<HeaderField> SwHeaders(std::string_view signature, std::string_view prefix = "webhook-") {
  static const std::string kT = std::to_string(kSwT);
  static constexpr std::string_view kNames[][3] = {{"webhook-id", "webhook-timestamp", "webhook-signature"},
                                                   {"svix-id", "svix-timestamp", "svix-signature"},
                                                   {"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"}};
  const auto& names = prefix == "svix-" ? kNames[1] : prefix == "Webhook-" ? kNames[2] : kNames[0];
  return {{names[0], kSwId}, {names[1], kT}, {names[2], signature}};
}

TEST(StandardWebhooksTest, AcceptsThePublishedExampleAndKeysByTheMessageId) {
  ExpectKey(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig))), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
}

TEST(StandardWebhooksTest, AcceptsSvixHeaderNamesAndAnySecretSpelling) {
  ExpectKey(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig), "svix-")), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
  ExpectKey(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig), "Webhook-")), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
  // The secret without its "whsec_" prefix is the same key.
  ExpectKey(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig)), kSwBody, kSwT, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
}

TEST(StandardWebhooksTest, AnyMatchingV1AmongSeveralPasses) {
  // Key rotation: the sender signs with the old and the new secret.
  const std::string both = "v1," + std::string(kSwOtherSig) + " v1a,c29tZXRoaW5nIGVsc2U= v1," + std::string(kSwSig);
  ExpectKey(StandardWebhooks(SwHeaders(both)), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
  ExpectKey(StandardWebhooks(SwHeaders(both), kSwBody, kSwT, "whsec_c2VjcmV0LWtleS1mb3ItaWRlbWdhdGUtdGVzdHM="),
            "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
}

TEST(StandardWebhooksTest, RefusesWrongSecretTamperingAndOtherVersions) {
  ExpectInvalid(StandardWebhooks(SwHeaders("v1," + std::string(kSwOtherSig))));
  ExpectInvalid(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig)), R"({"test": 2432232315})"));
  ExpectInvalid(StandardWebhooks(SwHeaders("v1a," + std::string(kSwSig))));  // asymmetric: not an HMAC
  ExpectInvalid(StandardWebhooks(SwHeaders("v2," + std::string(kSwSig))));
  ExpectInvalid(StandardWebhooks(SwHeaders(std::string(kSwSig))));  // no version
  ExpectInvalid(StandardWebhooks(SwHeaders("v1,not base64!")));
  ExpectInvalid(StandardWebhooks(SwHeaders("")));
  // Another id or timestamp than the one signed.
  const std::string sig = "v1," + std::string(kSwSig);
  auto headers = SwHeaders(sig);
  headers[0].value = "msg_other";
  ExpectInvalid(StandardWebhooks(headers));
  headers = SwHeaders(sig);
  headers[1].value = "1614265331";
  ExpectInvalid(StandardWebhooks(headers, kSwBody, 1614265331));
}

TEST(StandardWebhooksTest, RefusesMissingRepeatedOrMalformedHeaders) {
  const std::string sig = "v1," + std::string(kSwSig);
  for (std::size_t drop = 0; drop < 3; ++drop) {
    auto headers = SwHeaders(sig);
    headers.erase(headers.begin() + static_cast<std::ptrdiff_t>(drop));
    ExpectInvalid(StandardWebhooks(headers));
  }
  auto repeated = SwHeaders(sig);
  repeated.push_back(repeated[0]);
  ExpectInvalid(StandardWebhooks(repeated));
  for (const std::string_view bad : {"", "-1614265330", "1614265330.0", "16142653x0", "99999999999999999999"}) {
    auto headers = SwHeaders(sig);
    headers[1].value = bad;
    ExpectInvalid(StandardWebhooks(headers));
  }
}

// A signed id the gateway does not take is a verified request without a
// usable id (400 translation-failed), not a bad signature (401).
TEST(StandardWebhooksTest, AnEmptyIdOrOneWithADotIsNoIdOnceVerified) {
  // K as above; printf '%s' 'msg.1.1614265330.{"test": 2432232314}' (and '.1614265330.{...}') |
  //   openssl dgst -sha256 -mac HMAC -macopt hexkey:$K -binary | base64
  struct Case {
    std::string_view id, signature;
  };
  for (const Case& c : {Case{"msg.1", "v1,g84Fr48iNUfeALcCN2LRQhSXJZ7Hs8lJ7kFx76VJCDU="},
                        Case{"", "v1,BbrBopkxy1IaPTmLxhGOIjtynRWNh3UqphKDPFaJ1cU="}}) {
    SCOPED_TRACE(c.id);
    auto headers = SwHeaders(c.signature);
    headers[0].value = c.id;
    const Translation t = StandardWebhooks(headers);
    ExpectNoId(t);
    EXPECT_NE(t.detail.find("webhook-id"), std::string::npos) << t.detail;
    // Checked after the signature and the timestamp, which win.
    ExpectInvalid(StandardWebhooks(headers, R"({"test": 0})"));
    ExpectInvalid(StandardWebhooks(headers, kSwBody, kSwT + 301));
  }
}

// Why a '.' is not taken: the MAC covers "id.timestamp.body" whichever way it
// is cut, so a captured delivery whose body holds ".<digits>." could come
// again under another id and timestamp.
TEST(StandardWebhooksTest, ASignatureCannotBeCutIntoAnotherId) {
  // printf '%s' 'msg_1.1614265330.a.1614265400.b' | openssl dgst -sha256 -mac HMAC -macopt hexkey:$K -binary | base64
  const std::string sig = "v1,wjxfBGC97/HZnp4kFOosuAZEgcYT1QDLyF595cCwtlY=";
  ExpectKey(StandardWebhooks({{"webhook-id", "msg_1"}, {"webhook-timestamp", "1614265330"}, {"webhook-signature", sig}},
                             "a.1614265400.b", 1614265330),
            "webhook-msg_1");
  ExpectNoId(StandardWebhooks(
      {{"webhook-id", "msg_1.1614265330.a"}, {"webhook-timestamp", "1614265400"}, {"webhook-signature", sig}}, "b",
      1614265400));
}

TEST(StandardWebhooksTest, TimestampToleranceIsFiveMinutesEitherWay) {
  const std::string sig = "v1," + std::string(kSwSig);
  const auto headers = SwHeaders(sig);
  ExpectKey(StandardWebhooks(headers, kSwBody, kSwT + 300), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
  ExpectKey(StandardWebhooks(headers, kSwBody, kSwT - 300), "webhook-msg_p5jXN8AQM9LWM0D4loKWxJek");
  ExpectInvalid(StandardWebhooks(headers, kSwBody, kSwT + 301));
  ExpectInvalid(StandardWebhooks(headers, kSwBody, kSwT - 301));
}

TEST(StandardWebhooksTest, ASecretThatIsNotBase64MatchesNothing) {
  EXPECT_EQ(StandardWebhooksKey("whsec_not base64"), std::nullopt);
  EXPECT_EQ(StandardWebhooksKey("whsec_"), std::nullopt);
  EXPECT_EQ(StandardWebhooksKey("whsec_c2VjcmV0LWtleS1mb3ItaWRlbWdhdGUtdGVzdHM="), "secret-key-for-idemgate-tests");
  ExpectInvalid(StandardWebhooks(SwHeaders("v1," + std::string(kSwSig)), kSwBody, kSwT, "whsec_%%%"));
}

// ---------------------------------------------------------------------------
// Stripe

constexpr std::string_view kStripeSecret = "whsec_test";
constexpr std::int64_t kStripeT = 1700000000;
constexpr std::string_view kStripeBody = R"({"id":"evt_1"})";
// printf '%s' '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_test
constexpr std::string_view kStripeSig = "c89214b5b5da833daed6f0b8c5bb6bd58cea9022bd80ccc78230f3942d632925";
// printf '%s' '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_other
constexpr std::string_view kStripeOtherSig = "d8d091c76b586cff4dbd317fc47ebddff4b86de3ce18d3c03753c3c1901d475a";

Translation Stripe(std::string_view header, std::string_view body = kStripeBody, std::int64_t now = kStripeT,
                   std::string_view secret = kStripeSecret) {
  return Translate(Provider::kStripe, nullptr, secret, Request(body, {{"Stripe-Signature", header}}, "", now));
}

std::string StripeHeader(std::string_view v1) { return "t=1700000000,v1=" + std::string(v1); }

TEST(StripeTest, AcceptsValidSignature) { ExpectKey(Stripe(StripeHeader(kStripeSig)), "stripe-evt_1"); }

TEST(StripeTest, AcceptsUpperCaseHexAndSpacesAroundItems) {
  ExpectKey(Stripe(" t=1700000000 ,\tv1=C89214B5B5DA833DAED6F0B8C5BB6BD58CEA9022BD80CCC78230F3942D632925 "),
            "stripe-evt_1");
}

TEST(StripeTest, HeaderNameIsCaseInsensitive) {
  const std::string header = StripeHeader(kStripeSig);
  const auto t = Translate(Provider::kStripe, nullptr, kStripeSecret,
                           Request(kStripeBody, {{"stripe-SIGNATURE", header}}, "", kStripeT));
  ExpectKey(t, "stripe-evt_1");
}

TEST(StripeTest, RefusesWrongSecret) {
  const Translation t = Stripe(StripeHeader(kStripeSig), kStripeBody, kStripeT, "whsec_wrong");
  ExpectInvalid(t);
  EXPECT_EQ(t.detail.find("whsec_wrong"), std::string::npos);
  EXPECT_EQ(t.detail.find("whsec"), std::string::npos);
}

TEST(StripeTest, RefusesSignatureMadeWithAnotherSecret) { ExpectInvalid(Stripe(StripeHeader(kStripeOtherSig))); }

TEST(StripeTest, RefusesTamperedBody) {
  ExpectInvalid(Stripe(StripeHeader(kStripeSig), R"({"id":"evt_2"})"));
  ExpectInvalid(Stripe(StripeHeader(kStripeSig), R"({"id":"evt_1"} )"));
}

TEST(StripeTest, RefusesTamperedTimestamp) {
  // The same v1 with another t: the signed payload differs.
  ExpectInvalid(Stripe("t=1700000001,v1=" + std::string(kStripeSig), kStripeBody, 1700000001));
  // Leading zeros are part of the timestamp as sent, so they change the payload too.
  ExpectInvalid(Stripe("t=01700000000,v1=" + std::string(kStripeSig)));
}

TEST(StripeTest, RefusesMissingOrRepeatedHeader) {
  ExpectInvalid(Translate(Provider::kStripe, nullptr, kStripeSecret, Request(kStripeBody, {}, "", kStripeT)));
  const std::string header = StripeHeader(kStripeSig);
  ExpectInvalid(
      Translate(Provider::kStripe, nullptr, kStripeSecret,
                Request(kStripeBody, {{"Stripe-Signature", header}, {"stripe-signature", header}}, "", kStripeT)));
}

TEST(StripeTest, TimestampToleranceIsInclusive) {
  const std::string header = StripeHeader(kStripeSig);
  ExpectKey(Stripe(header, kStripeBody, kStripeT + 300), "stripe-evt_1");
  ExpectKey(Stripe(header, kStripeBody, kStripeT - 300), "stripe-evt_1");
  EXPECT_EQ(kStripeToleranceSeconds, 300);
}

TEST(StripeTest, RefusesTimestampOutsideTolerance) {
  const std::string header = StripeHeader(kStripeSig);
  for (const std::int64_t now : {kStripeT + 301, kStripeT - 301, std::int64_t{0}, INT64_MIN, INT64_MAX}) {
    const Translation t = Stripe(header, kStripeBody, now);
    ExpectInvalid(t);
    EXPECT_NE(t.detail.find("tolerance"), std::string::npos) << t.detail;
  }
}

TEST(StripeTest, AcceptsAnyMatchingV1) {
  ExpectKey(Stripe("t=1700000000,v1=" + std::string(kStripeOtherSig) + ",v1=" + std::string(kStripeSig)),
            "stripe-evt_1");
  ExpectKey(Stripe("v1=" + std::string(kStripeSig) + ",v1=" + std::string(kStripeOtherSig) + ",t=1700000000"),
            "stripe-evt_1");
  // A malformed v1 next to a good one does not spoil it.
  ExpectKey(Stripe("t=1700000000,v1=zz,v1=" + std::string(kStripeSig)), "stripe-evt_1");
}

TEST(StripeTest, IgnoresV0AndUnknownItems) {
  ExpectKey(Stripe("t=1700000000,v0=" + std::string(kStripeOtherSig) + ",v1=" + std::string(kStripeSig) +
                   ",scheme=x,novalue"),
            "stripe-evt_1");
}

TEST(StripeTest, RefusesV0Only) { ExpectInvalid(Stripe("t=1700000000,v0=" + std::string(kStripeSig))); }

TEST(StripeTest, RefusesMissingTimestampOrV1) {
  ExpectInvalid(Stripe("v1=" + std::string(kStripeSig)));
  ExpectInvalid(Stripe("t=1700000000"));
  ExpectInvalid(Stripe(""));
}

TEST(StripeTest, RefusesNonNumericTimestamp) {
  // printf '%s' 'abc.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_test
  ExpectInvalid(Stripe("t=abc,v1=7d65c0f956ef3a90b79011689a123d349f998f818878cc91cde67bcdedd30a90"));
  for (const std::string_view t :
       {"t=", "t=1700000000x", "t=-1700000000", "t=+1700000000", "t=1.5e9", "t=99999999999999999999"}) {
    ExpectInvalid(Stripe(std::string(t) + ",v1=" + std::string(kStripeSig)));
  }
}

TEST(StripeTest, RefusesRepeatedTimestamp) {
  ExpectInvalid(Stripe("t=1700000000,t=1700000000,v1=" + std::string(kStripeSig)));
}

TEST(StripeTest, RefusesMalformedV1) {
  ExpectInvalid(Stripe(StripeHeader(kStripeSig.substr(0, 62))));                     // too short
  ExpectInvalid(Stripe(StripeHeader(std::string(kStripeSig) + "00")));               // too long
  ExpectInvalid(Stripe(StripeHeader(std::string(kStripeSig.substr(0, 63)) + "g")));  // not hex
  ExpectInvalid(Stripe(StripeHeader(std::string(kStripeSig.substr(0, 63)))));        // odd length
  ExpectInvalid(Stripe(StripeHeader("")));
}

TEST(StripeTest, BodyNotJsonIsNoId) {
  // printf '%s' '1700000000.not json' | openssl dgst -sha256 -hmac whsec_test
  ExpectNoId(Stripe(StripeHeader("426ca3e864aa421cbf54b4338752b4df427774498d696393231daac6a5b6922e"), "not json"));
}

TEST(StripeTest, IdNotAStringIsNoId) {
  // printf '%s' '1700000000.{"id":42}' | openssl dgst -sha256 -hmac whsec_test
  ExpectNoId(Stripe(StripeHeader("0883b47833284e5d3b8fffddf4e143870ebbac24eb2540ca2f0a8325f297277a"), R"({"id":42})"));
}

TEST(StripeTest, MissingIdIsNoId) {
  // printf '%s' '1700000000.{"object":"event"}' | openssl dgst -sha256 -hmac whsec_test
  ExpectNoId(Stripe(StripeHeader("7c847613ac9e34020cf48a110be7ab754db29b3614685a84359baf6be372cdd7"),
                    R"({"object":"event"})"));
}

TEST(StripeTest, EmptyIdIsNoId) {
  // printf '%s' '1700000000.{"id":""}' | openssl dgst -sha256 -hmac whsec_test
  ExpectNoId(Stripe(StripeHeader("e78ef8dbf07b477e08ae82215fb706bdc64f072f3bb9140326d3f055d3e2e10e"), R"({"id":""})"));
}

// A body nested `levels` deep: an object holding `levels - 1` arrays.
std::string DeepStripeBody(int levels) {
  return R"({"id":"evt_deep","data":)" + std::string(levels - 1, '[') + std::string(levels - 1, ']') + "}";
}

TEST(StripeTest, BodiesNestUpToTheFingerprintsDepth) {
  // B='{"id":"evt_deep","data":'$(printf '[%.0s' $(seq 63))$(printf ']%.0s' $(seq 63))'}'
  // printf '%s' "1700000000.$B" | openssl dgst -sha256 -hmac whsec_test
  ExpectKey(Stripe(StripeHeader("86da71ee6857e64a75ceb6b07ed77d479fdcedf9a0d26b5cdd41bded7d276883"),
                   DeepStripeBody(64)),
            "stripe-evt_deep");
  // The same with 64 arrays: one level too deep.
  const Translation t = Stripe(StripeHeader("d9bc1494ede4f2527e601faa358e848cf32016301df87580dde58e51928789a9"),
                               DeepStripeBody(65));
  ExpectNoId(t);
  EXPECT_EQ(t.detail, "body is not JSON");
}

TEST(StripeTest, BadSignatureWinsOverMissingId) { ExpectInvalid(Stripe(StripeHeader(kStripeSig), "not json")); }

// ---------------------------------------------------------------------------
// GitHub

constexpr std::string_view kGitHubSecret = "It's a Secret to Everybody";
constexpr std::string_view kGitHubBody = "Hello, World!";
// GitHub's documented example; also
// printf '%s' 'Hello, World!' | openssl dgst -sha256 -hmac "It's a Secret to Everybody"
constexpr std::string_view kGitHubSig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
constexpr std::string_view kDelivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";

Translation GitHub(std::vector<HeaderField> headers, std::string_view body = kGitHubBody,
                   std::string_view secret = kGitHubSecret) {
  return Translate(Provider::kGitHub, nullptr, secret, Request(body, std::move(headers)));
}

TEST(GitHubTest, AcceptsPublishedExample) {
  ExpectKey(GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}}),
            "github-72d3162e-cc78-11e3-81ab-4c9367dc0958");
}

TEST(GitHubTest, HeaderNamesAreCaseInsensitiveAndValuesTrimmed) {
  const std::string sig = " \t" + std::string(kGitHubSig) + "\t ";
  ExpectKey(GitHub({{"x-hub-signature-256", sig}, {"X-GITHUB-DELIVERY", "  abc\t"}}), "github-abc");
}

TEST(GitHubTest, AcceptsUpperCaseHex) {
  ExpectKey(GitHub({{"X-Hub-Signature-256", "sha256=757107EA0EB2509FC211221CCE984B8A37570B6D7586C22C46F4379C8B043E17"},
                    {"X-GitHub-Delivery", "d1"}}),
            "github-d1");
}

TEST(GitHubTest, AcceptsEmptyBody) {
  // printf '' | openssl dgst -sha256 -hmac "It's a Secret to Everybody"
  ExpectKey(GitHub({{"X-Hub-Signature-256", "sha256=66a0c074deaa0f489ead6537e0d32f9a344b90bbeda705b6ed45ecd3b413fb40"},
                    {"X-GitHub-Delivery", "d2"}},
                   std::string_view()),
            "github-d2");
}

TEST(GitHubTest, RefusesWrongSecret) {
  const Translation t =
      GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}}, kGitHubBody, "not the secret");
  ExpectInvalid(t);
  EXPECT_EQ(t.detail.find("not the secret"), std::string::npos);
  const Translation good_secret_bad_body =
      GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}}, "Hello, World?");
  EXPECT_EQ(good_secret_bad_body.detail.find(kGitHubSecret), std::string::npos);
}

TEST(GitHubTest, RefusesTamperedBody) {
  ExpectInvalid(GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}}, "Hello, World?"));
  ExpectInvalid(GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}}, ""));
}

TEST(GitHubTest, RefusesMissingOrRepeatedSignature) {
  ExpectInvalid(GitHub({{"X-GitHub-Delivery", kDelivery}}));
  ExpectInvalid(
      GitHub({{"X-Hub-Signature", "sha1=0000000000000000000000000000000000000000"}, {"X-GitHub-Delivery", kDelivery}}));
  ExpectInvalid(GitHub(
      {{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", kDelivery}, {"x-hub-signature-256", kGitHubSig}}));
}

TEST(GitHubTest, RefusesMalformedSignature) {
  const std::string hex(kGitHubSig.substr(7));
  for (const std::string& sig : {hex,                                  // no prefix
                                 "SHA256=" + hex,                      // prefix is lower case
                                 "sha1=" + hex,                        // another algorithm
                                 "sha256=" + hex.substr(0, 62),        // too short
                                 "sha256=" + hex + "ab",               // too long
                                 "sha256=" + hex.substr(0, 63) + "x",  // not hex
                                 "sha256=" + hex.substr(0, 63),        // odd length
                                 "sha256= " + hex,                     // space inside
                                 std::string("sha256=")}) {
    ExpectInvalid(GitHub({{"X-Hub-Signature-256", sig}, {"X-GitHub-Delivery", kDelivery}}));
  }
}

TEST(GitHubTest, MissingDeliveryIsNoId) {
  ExpectNoId(GitHub({{"X-Hub-Signature-256", kGitHubSig}}));
  ExpectNoId(GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", " "}}));
}

TEST(GitHubTest, RepeatedDeliveryIsNoId) {
  ExpectNoId(GitHub({{"X-Hub-Signature-256", kGitHubSig}, {"X-GitHub-Delivery", "a"}, {"x-github-delivery", "a"}}));
}

TEST(GitHubTest, BadSignatureWinsOverMissingDelivery) {
  ExpectInvalid(GitHub({{"X-Hub-Signature-256", kGitHubSig}}, "tampered"));
}

// ---------------------------------------------------------------------------
// Twilio

constexpr std::string_view kTwilioToken = "token";
constexpr std::string_view kFormType = "application/x-www-form-urlencoded";

Translation Twilio(std::string_view url, std::string_view body, std::string_view signature,
                   std::string_view content_type = kFormType, std::string_view token = kTwilioToken) {
  return Translate(Provider::kTwilio, nullptr, token,
                   Request(body, {{"Content-Type", content_type}, {"X-Twilio-Signature", signature}}, url));
}

// printf '%s' 'https://example.com/hookMessageSidSM123' | openssl dgst -sha1 -hmac token -binary | base64
constexpr std::string_view kTwilioSidOnlySig = "76nYis7UPzH9939SZW85KasZfdI=";

TEST(TwilioTest, SortsAndDecodesFormParameters) {
  // S='https://example.com/hook?a=1BodyHello world!From+15551234567MessageSidSM123MessageStatusdelivered'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com/hook?a=1",
                   "MessageStatus=delivered&MessageSid=SM123&From=%2B15551234567&Body=Hello+world%21",
                   "ia/XFVi9v5J6W+g1XyGRdq0+1T4="),
            "twilio-SM123-delivered");
}

TEST(TwilioTest, AcceptsDocumentedLayout) {
  // S='https://example.com/hook?a=1From+15551234567MessageSidSM123MessageStatusdelivered'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  constexpr std::string_view kSig = "8B4iEi//oXerkgbBaWtEz0Lhcrg=";
  ExpectKey(
      Twilio("https://example.com/hook?a=1", "MessageSid=SM123&MessageStatus=delivered&From=%2b15551234567", kSig),
      "twilio-SM123-delivered");
  // Empty pairs are skipped.
  ExpectKey(
      Twilio("https://example.com/hook?a=1", "&MessageSid=SM123&&MessageStatus=delivered&From=%2B15551234567&", kSig),
      "twilio-SM123-delivered");
}

TEST(TwilioTest, SortsRepeatedNamesByValue) {
  // printf '%s' 'https://example.com/hookMessageSidSM123TagaTagb' | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com/hook", "Tag=b&MessageSid=SM123&Tag=a", "aly6SDxxiGIGLSEEwjEEw6OOlf4="),
            "twilio-SM123");
}

TEST(TwilioTest, StatusFallsBackToSmsStatus) {
  // S='https://example.com/hookMessageSidSM123SmsStatussent'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com/hook", "SmsStatus=sent&MessageSid=SM123", "7za5rziRyZUMJLBYUGXpAzo7kzg="),
            "twilio-SM123-sent");
}

TEST(TwilioTest, KeyIsTheSidWithoutAnyStatus) {
  ExpectKey(Twilio("https://example.com/hook", "MessageSid=SM123", kTwilioSidOnlySig), "twilio-SM123");
}

// Twilio signs names and values run together, not where they are cut: a
// delivery sent again cut elsewhere under the same signature must not read
// as another sid or status (another key, run again). The key is read from
// the signed text, so every cut either makes the original's key or none.
void ExpectKeyOrNoId(const Translation& t, std::string_view key) {
  if (t.outcome == Outcome::kNoId) return;
  ExpectKey(t, key);
}

TEST(TwilioTest, RecutFormsMakeTheOriginalsKeyOrNone) {
  // S='https://example.com/hookMessageSidSMabc1MessageStatusdeliveredSmsStatusdeliveredTo+1555'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  constexpr std::string_view kSig = "YceoeBE2lQ0X3A6s3MPH61FfzmM=";
  ExpectKey(Twilio("https://example.com/hook",
                   "MessageSid=SMabc1&MessageStatus=delivered&SmsStatus=delivered&To=%2B1555", kSig),
            "twilio-SMabc1-delivered");
  for (const std::string_view body : {
           // The status runs on into the following fields.
           "MessageSid=SMabc1&MessageStatus=deliveredSmsStatusdelivered&To=%2B1555",
           // The status cut short, its end starting the next field's name.
           "MessageSid=SMabc1&MessageStatus=deliv&eredSmsStatusdeliveredTo=%2B1555",
           // The name run on into the value, or cut short.
           "MessageSid=SMabc1&MessageStatusdel=ivered&SmsStatus=delivered&To=%2B1555",
           "MessageSid=SMabc1&MessageStat=usdelivered&SmsStatus=delivered&To=%2B1555",
           // The sid runs on into the status.
           "MessageSid=SMabc1MessageStatusdelivered&SmsStatus=delivered&To=%2B1555",
       }) {
    SCOPED_TRACE(body);
    ExpectKeyOrNoId(Twilio("https://example.com/hook", body, kSig), "twilio-SMabc1-delivered");
  }
  // S='https://example.com/hookMessageSidSMabc1SmsSidSMabc1SmsStatusreceived'
  constexpr std::string_view kSmsSig = "9k7ReGihAfhtqqPtNH7VIaP/Dqo=";
  ExpectKey(Twilio("https://example.com/hook", "MessageSid=SMabc1&SmsSid=SMabc1&SmsStatus=received", kSmsSig),
            "twilio-SMabc1-received");
  // The status taken into another field's value, or split across a name.
  for (const std::string_view body : {"MessageSid=SMabc1&SmsSid=SMabc1SmsStatusreceived",
                                      "MessageSid=SMabc1&SmsSid=SMabc1Sms&Statusreceived="}) {
    SCOPED_TRACE(body);
    ExpectKeyOrNoId(Twilio("https://example.com/hook", body, kSmsSig), "twilio-SMabc1-received");
  }
}

// A sid or status of another shape than Twilio's, or a name the signed text
// holds twice (in a message body), leaves the reading of the key open: the
// key is the SHA-256 of the signed text, the same for every cut of it.
TEST(TwilioTest, AnOpenReadingMakesTheKeyOfTheSignedText) {
  struct Case {
    std::string_view body, signature, fields;
  };
  // S="https://example.com/hook" + the fields (MessageSidSMx-aMessageStatusb, ...)
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  for (const Case& c : {Case{"MessageSid=SMx-a&MessageStatus=b", "wsIBRV44MCzm71wmJUbREzKcYAE=",
                             "MessageSidSMx-aMessageStatusb"},
                        Case{"MessageSid=SMx&MessageStatus=a-b", "NLU4GSKU2hCUYI99NvWq297c5I8=",
                             "MessageSidSMxMessageStatusa-b"},
                        Case{"MessageSid=SM~1&MessageStatus=a~2Db", "VEsxHhxod32862aDpjkakQq0lHk=",
                             "MessageSidSM~1MessageStatusa~2Db"}}) {
    SCOPED_TRACE(c.body);
    ExpectKey(Twilio("https://example.com/hook", c.body, c.signature),
              "twilio-signed-" + Sha256Hex("https://example.com/hook" + std::string(c.fields)));
  }
  // S='https://example.com/hookBodyxMessageSidSM1SmsStatusreceivedZMessageSidSMabc1SmsStatusreceived'
  constexpr std::string_view kSig = "N2VjY2GHtaOvpqTgQoDq1y20BmM=";
  const std::string fields = "BodyxMessageSidSM1SmsStatusreceivedZMessageSidSMabc1SmsStatusreceived";
  const std::string key = "twilio-signed-" + Sha256Hex("https://example.com/hook" + fields);
  // An incoming message whose body spells another sid, and the same text cut
  // to make that sid a field of its own: one key.
  ExpectKey(Twilio("https://example.com/hook",
                   "Body=xMessageSidSM1SmsStatusreceivedZ&MessageSid=SMabc1&SmsStatus=received", kSig),
            key);
  ExpectKeyOrNoId(Twilio("https://example.com/hook",
                         "Body=x&MessageSid=SM1&SmsStatus=received&ZMessageSidSMabc1SmsStatus=received", kSig),
                  key);
  // S='https://example.com/hookMessageSidSM123MessageStatusSmsStatus'
  ExpectNoId(Twilio("https://example.com/hook", "MessageSid=SM123&MessageStatus=&SmsStatus=",
                    "RtypiSrJdeSyaDcrTjMU+jMru4A="));
}

// Nor where the URL ends: fields moved into a query the URL has, under the
// same signature, make the delivery's key.
TEST(TwilioTest, FieldsMovedIntoTheQueryMakeTheDeliverysKey) {
  // S='https://example.com/hook?src=twAccountSidAC1BodyxMessageSidhereMessageSidSMabc1SmsStatusreceived'
  constexpr std::string_view kSig = "HVotvvReFzHD24RpwcXwufX087I=";
  const std::string text =
      "https://example.com/hook?src=twAccountSidAC1BodyxMessageSidhereMessageSidSMabc1SmsStatusreceived";
  const std::string key = "twilio-signed-" + Sha256Hex(text);
  ExpectKey(Twilio("https://example.com/hook?src=tw",
                   "AccountSid=AC1&Body=xMessageSidhere&MessageSid=SMabc1&SmsStatus=received", kSig),
            key);
  ExpectKeyOrNoId(Twilio("https://example.com/hook?src=twAccountSidAC1",
                         "Body=xMessageSidhere&MessageSid=SMabc1&SmsStatus=received", kSig),
                  key);
}

// With bodySHA256 the signature covers the URL alone, which can be made of
// another delivery's signed text: a messaging callback makes no key so.
TEST(TwilioTest, BodySha256MakesNoMessagingKey) {
  const std::string body = "MessageSid=SM999&MessageStatus=delivered";
  const std::string url = "https://example.com/hook?bodySHA256=" + Sha256Hex(body);
  // printf '%s' "$url" | openssl dgst -sha1 -hmac token -binary | base64
  const Translation t = Twilio(url, body, "tNeg859iNnMnfYZJpkHyczRaxjo=");
  EXPECT_EQ(t.outcome, Outcome::kNoId) << t.key << t.detail;
}

TEST(TwilioTest, MessageStatusWinsOverSmsStatus) {
  // S='https://example.com/hookMessageSidSM123MessageStatusdeliveredSmsStatussent'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com/hook", "SmsStatus=sent&MessageStatus=delivered&MessageSid=SM123",
                   "wHK56SAnWrNcPx+ZtnkQ6Om8gPg="),
            "twilio-SM123-delivered");
}

TEST(TwilioTest, RepeatedMessageSidIsNoId) {
  // S='https://example.com/hookMessageSidSM123MessageSidSM124'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  ExpectNoId(Twilio("https://example.com/hook", "MessageSid=SM124&MessageSid=SM123", "HpbVFlxIRaX7PbAAkCqlfjtoMeE="));
}

TEST(TwilioTest, ContentTypeIsCaseInsensitiveWithParameters) {
  ExpectKey(Twilio("https://example.com/hook", "MessageSid=SM123", kTwilioSidOnlySig,
                   "Application/X-WWW-Form-URLEncoded ; charset=utf-8"),
            "twilio-SM123");
  const auto t =
      Translate(Provider::kTwilio, nullptr, kTwilioToken,
                Request("MessageSid=SM123", {{"x-twilio-signature", kTwilioSidOnlySig}, {"content-type", kFormType}},
                        "https://example.com/hook"));
  ExpectKey(t, "twilio-SM123");
}

TEST(TwilioTest, TriesUrlWithoutDefaultPort) {
  // Signed without the port, called with it.
  ExpectKey(Twilio("https://example.com:443/hook", "MessageSid=SM123", kTwilioSidOnlySig), "twilio-SM123");
}

TEST(TwilioTest, TriesUrlWithDefaultPort) {
  // printf '%s' 'https://example.com:443/hookMessageSidSM123' | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com/hook", "MessageSid=SM123", "z50XhUtUVPB1YtQIjgSrcIJFXXM="), "twilio-SM123");
  // printf '%s' 'http://example.com:80/hookMessageSidSM123' | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("http://example.com/hook", "MessageSid=SM123", "9P2YtgnW3fLhIl+FLezWvUnRdTU="), "twilio-SM123");
}

TEST(TwilioTest, TriesUrlWithoutAnyPort) {
  // Twilio drops an https URL's port before signing (its validators accept
  // both forms): signed without the port, called with another one.
  ExpectKey(Twilio("https://example.com:8443/hook", "MessageSid=SM123", kTwilioSidOnlySig), "twilio-SM123");
  ExpectKey(Twilio("https://example.com:80/hook", "MessageSid=SM123", kTwilioSidOnlySig), "twilio-SM123");
  // Still signed with the port.
  // printf '%s' 'https://example.com:8443/hookMessageSidSM123' | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(Twilio("https://example.com:8443/hook", "MessageSid=SM123", "56xqwabnig9CtcYpJQsUNlukBHM="),
            "twilio-SM123");
  // Neither form is another port, nor another scheme.
  ExpectInvalid(Twilio("https://example.com:9443/hook", "MessageSid=SM123", "56xqwabnig9CtcYpJQsUNlukBHM="));
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123", "56xqwabnig9CtcYpJQsUNlukBHM="));
  ExpectInvalid(Twilio("http://example.com:443/hook", "MessageSid=SM123", kTwilioSidOnlySig));
}

TEST(TwilioTest, RefusesWrongToken) {
  const Translation t = Twilio("https://example.com/hook", "MessageSid=SM123", kTwilioSidOnlySig, kFormType, "other");
  ExpectInvalid(t);
  EXPECT_EQ(t.detail.find("other"), std::string::npos);
  // printf '%s' 'https://example.com/hookMessageSidSM123' | openssl dgst -sha1 -hmac other -binary | base64
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123", "WMio3NaB0eE2/JYWb+rMYmaHTbk="));
}

TEST(TwilioTest, RefusesTamperedBodyOrUrl) {
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM124", kTwilioSidOnlySig));
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123&Extra=1", kTwilioSidOnlySig));
  ExpectInvalid(Twilio("https://example.com/hook2", "MessageSid=SM123", kTwilioSidOnlySig));
  ExpectInvalid(Twilio("http://example.com/hook", "MessageSid=SM123", kTwilioSidOnlySig));
}

TEST(TwilioTest, RefusesMissingOrRepeatedSignature) {
  ExpectInvalid(Translate(Provider::kTwilio, nullptr, kTwilioToken,
                          Request("MessageSid=SM123", {{"Content-Type", kFormType}}, "https://example.com/hook")));
  ExpectInvalid(Translate(Provider::kTwilio, nullptr, kTwilioToken,
                          Request("MessageSid=SM123",
                                  {{"Content-Type", kFormType},
                                   {"X-Twilio-Signature", kTwilioSidOnlySig},
                                   {"X-Twilio-Signature", kTwilioSidOnlySig}},
                                  "https://example.com/hook")));
}

TEST(TwilioTest, RefusesMalformedSignature) {
  for (const std::string_view sig : {"",
                                     "76nYis7UPzH9939SZW85KasZfdI",              // no padding
                                     "76nYis7UPzH9939SZW85KasZfdI==",            // too much padding
                                     "76nYis7UPzH9939SZW85Kas=ZfdI",             // padding inside
                                     "76nYis7UPzH9939SZW85KasZf!I=",             // not base64
                                     "76nYis7UPzH9939SZW85KasZfdIA",             // 21 bytes
                                     "AAAAAAAAAAAAAAAAAAAAAA==",                 // 16 bytes
                                     "76nYis7UPzH9939SZW85KasZfdI=76nYis7U"}) {  // trailing data
    ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123", sig));
  }
}

// printf '%s' 'https://example.com/hook' | openssl dgst -sha1 -hmac token -binary | base64
constexpr std::string_view kTwilioUrlOnlySig = "tMcfjLrUB7eIjpvVwlMoqV6FM40=";

// A signature over the URL alone covers no body: one that is not a form is
// signed only through the URL's bodySHA256.
TEST(TwilioTest, NonFormBodyWithoutBodySha256IsRefused) {
  for (const std::string_view type : {"application/json", "text/plain"}) {
    SCOPED_TRACE(type);
    const Translation t = Twilio("https://example.com/hook", "MessageSid=SM123", kTwilioUrlOnlySig, type);
    ExpectInvalid(t);
    EXPECT_NE(t.detail.find("bodySHA256"), std::string::npos) << t.detail;
  }
  // A bad percent escape: the body is not a form.
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123&Body=%zz", kTwilioUrlOnlySig));
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123&Body=%4", kTwilioUrlOnlySig));
  ExpectInvalid(Twilio("https://example.com/hook", "MessageSid=SM123&Body=%zz", kTwilioSidOnlySig));
  // No Content-Type at all.
  ExpectInvalid(Translate(Provider::kTwilio, nullptr, kTwilioToken,
                          Request("MessageSid=SM123", {{"X-Twilio-Signature", kTwilioUrlOnlySig}},
                                  "https://example.com/hook")));
}

TEST(TwilioTest, EmptyNonFormBodyIsSignedAsUrlAloneAndHasNoId) {
  ExpectNoId(Twilio("https://example.com/hook", "", kTwilioUrlOnlySig, "application/json"));
}

TEST(TwilioTest, MissingMessageSidIsNoId) {
  // printf '%s' 'https://example.com/hookFromx' | openssl dgst -sha1 -hmac token -binary | base64
  ExpectNoId(Twilio("https://example.com/hook", "From=x", "DSxZI6p8/Vexeg95T/bHPARZAlY="));
}

TEST(TwilioTest, BadSignatureWinsOverMissingSid) {
  ExpectInvalid(Twilio("https://example.com/hook", "From=x", kTwilioSidOnlySig));
}

// printf '%s' '{"data":{"sid":"ET1"}}' | openssl dgst -sha256
constexpr std::string_view kEventBody = R"({"data":{"sid":"ET1"}})";
constexpr std::string_view kEventUrl =
    "https://example.com/events?bodySHA256=4c0daa6f2ed6584b2bd802c54e4081b69b6a0ec5c3874bbd612ce08ba01e6907";
// S='https://example.com/events?bodySHA256=4c0daa6f2ed6584b2bd802c54e4081b69b6a0ec5c3874bbd612ce08ba01e6907'
// printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
constexpr std::string_view kEventSig = "nUCQOP+JYiXzFyA3aw4iZP8uYb8=";

TEST(TwilioTest, BodySha256SignsTheUrlAlone) {
  // Verified, but a JSON body carries no MessageSid.
  const Translation t = Twilio(kEventUrl, kEventBody, kEventSig, "application/json");
  ExpectNoId(t);
}

TEST(TwilioTest, BodySha256MustMatchTheBody) {
  ExpectInvalid(Twilio(kEventUrl, R"({"data":{"sid":"ET2"}})", kEventSig, "application/json"));
}

// ---------------------------------------------------------------------------
// Twilio Event Streams

Translation EventStreams(std::vector<HeaderField> headers, std::string_view url = kEventUrl,
                         std::string_view body = kEventBody, std::string_view token = kTwilioToken) {
  return Translate(Provider::kTwilioEventStreams, nullptr, token, Request(body, std::move(headers), url));
}

TEST(TwilioEventStreamsTest, AcceptsValidSignature) {
  ExpectKey(EventStreams({{"Content-Type", "application/json"},
                          {"X-Twilio-Signature", kEventSig},
                          {"I-Twilio-Idempotency-Token", "idem-42"}}),
            "twilio-idem-42");
}

TEST(TwilioEventStreamsTest, HeaderNamesAreCaseInsensitive) {
  ExpectKey(EventStreams({{"x-twilio-signature", kEventSig}, {"i-twilio-idempotency-token", " idem-42 "}}),
            "twilio-idem-42");
}

TEST(TwilioEventStreamsTest, AcceptsUpperCaseBodySha256) {
  // S='https://example.com/events?bodySHA256=4C0DAA6F2ED6584B2BD802C54E4081B69B6A0EC5C3874BBD612CE08BA01E6907'
  // printf '%s' "$S" | openssl dgst -sha1 -hmac token -binary | base64
  ExpectKey(EventStreams({{"X-Twilio-Signature", "8OQIabamyoIm3itTUfV1YdCYVcA="}, {"I-Twilio-Idempotency-Token", "t"}},
                         "https://example.com/events?bodySHA256="
                         "4C0DAA6F2ED6584B2BD802C54E4081B69B6A0EC5C3874BBD612CE08BA01E6907"),
            "twilio-t");
}

TEST(TwilioEventStreamsTest, TriesUrlWithDefaultPort) {
  ExpectKey(EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}},
                         "https://example.com:443/events?"
                         "bodySHA256=4c0daa6f2ed6584b2bd802c54e4081b69b6a0ec5c3874bbd612ce08ba01e6907"),
            "twilio-t");
}

TEST(TwilioEventStreamsTest, TriesUrlWithoutAnyPort) {
  ExpectKey(EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}},
                         "https://example.com:8443/events?"
                         "bodySHA256=4c0daa6f2ed6584b2bd802c54e4081b69b6a0ec5c3874bbd612ce08ba01e6907"),
            "twilio-t");
}

// printf '%s' 'https://example.com/events' | openssl dgst -sha1 -hmac token -binary | base64
constexpr std::string_view kEventUrlOnlySig = "3eCkkJ+Ni3TCZ2ehcIJBvijSS7o=";

TEST(TwilioEventStreamsTest, BodyWithoutBodySha256IsRefused) {
  // Signed over the URL alone, so the body is covered by nothing: a JSON or
  // text body, or a form Content-Type whose body does not parse as one.
  for (const std::string_view type : {"application/json", "text/plain", "application/x-www-form-urlencoded"}) {
    SCOPED_TRACE(type);
    const Translation t = EventStreams(
        {{"Content-Type", type}, {"X-Twilio-Signature", kEventUrlOnlySig}, {"I-Twilio-Idempotency-Token", "t"}},
        "https://example.com/events", type == "text/plain" ? "anything" : R"({"data":{"sid":"%zz"}})");
    ExpectInvalid(t);
    EXPECT_NE(t.detail.find("bodySHA256"), std::string::npos) << t.detail;
  }
  // Without a body there is nothing to cover.
  ExpectKey(EventStreams({{"Content-Type", "application/json"},
                          {"X-Twilio-Signature", kEventUrlOnlySig},
                          {"I-Twilio-Idempotency-Token", "t"}},
                         "https://example.com/events", ""),
            "twilio-t");
}

TEST(TwilioEventStreamsTest, RefusesBodyMismatch) {
  const Translation t = EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}},
                                     kEventUrl, R"({"data":{"sid":"ET1"}} )");
  ExpectInvalid(t);
  EXPECT_NE(t.detail.find("bodySHA256"), std::string::npos) << t.detail;
}

TEST(TwilioEventStreamsTest, RefusesWrongToken) {
  const Translation t = EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}},
                                     kEventUrl, kEventBody, "sk_secret_token");
  ExpectInvalid(t);
  EXPECT_EQ(t.detail.find("sk_secret_token"), std::string::npos);
}

TEST(TwilioEventStreamsTest, RefusesTamperedUrl) {
  ExpectInvalid(EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}},
                             "https://example.com/events"));
}

TEST(TwilioEventStreamsTest, RefusesMissingRepeatedOrMalformedSignature) {
  ExpectInvalid(EventStreams({{"I-Twilio-Idempotency-Token", "t"}}));
  ExpectInvalid(EventStreams(
      {{"X-Twilio-Signature", kEventSig}, {"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}}));
  for (const std::string_view sig : {"nUCQOP+JYiXzFyA3aw4iZP8uYb8", "AAAAAAAAAAAAAAAAAAAAAA==", "nUCQOP+JYiXzFyA3"}) {
    ExpectInvalid(EventStreams({{"X-Twilio-Signature", sig}, {"I-Twilio-Idempotency-Token", "t"}}));
  }
}

TEST(TwilioEventStreamsTest, MissingOrRepeatedTokenIsNoId) {
  ExpectNoId(EventStreams({{"X-Twilio-Signature", kEventSig}}));
  ExpectNoId(EventStreams({{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", ""}}));
  ExpectNoId(EventStreams(
      {{"X-Twilio-Signature", kEventSig}, {"I-Twilio-Idempotency-Token", "t"}, {"i-twilio-idempotency-token", "t"}}));
}

// ---------------------------------------------------------------------------
// Generic

constexpr std::string_view kGenericSecret = "gsecret";
constexpr std::string_view kGenericBody =
    R"({"event":{"id/x":"ev_9","t~k":"tilde"},"n":12345,"big":18446744073709551615,"neg":-7,)"
    R"("items":["a","b"],"f":1.5,"e":""})";
// printf '%s' "$BODY" | openssl dgst -sha256 -hmac gsecret   (BODY being kGenericBody)
constexpr std::string_view kGenericHex256 = "cd05a167b42ba761892d9c7e5a30b6af1aa654ebffe2ab3bba3dc7ae3e578ba7";
// printf '%s' "$BODY" | openssl dgst -sha256 -hmac gsecret -binary | base64
constexpr std::string_view kGenericB64256 = "zQWhZ7Qrp2GJLZx+WjC2rxqmVOv/4qs7uj3Hrj5Xi6c=";
// printf '%s' "$BODY" | openssl dgst -sha1 -hmac gsecret
constexpr std::string_view kGenericHex1 = "efd731d0713fa7c7814a52fe20b93f5f7c194540";
// printf '%s' "$BODY" | openssl dgst -sha1 -hmac gsecret -binary | base64
constexpr std::string_view kGenericB641 = "79cx0HE/p8eBSlL+ILk/X3wZRUA=";
// printf '%s' "$BODY" | openssl dgst -sha256 -hmac wrong
constexpr std::string_view kGenericWrongHex256 = "ea9c3b3ee3cc5ac78d4b1e6b7aacbf18053460c17ccffd114ebc8bd686b9b6fb";

GenericSpec HeaderIdSpec() {
  GenericSpec spec;
  spec.header = "X-Signature";
  spec.prefix = "sha256=";
  spec.id_header = "X-Event-Id";
  return spec;
}

GenericSpec PointerSpec(std::string pointer) {
  GenericSpec spec;
  spec.header = "X-Signature";
  spec.id_pointer = std::move(pointer);
  return spec;
}

Translation Generic(const GenericSpec& spec, std::vector<HeaderField> headers, std::string_view body = kGenericBody,
                    std::string_view secret = kGenericSecret) {
  return Translate(Provider::kGeneric, &spec, secret, Request(body, std::move(headers)));
}

std::string Prefixed(std::string_view sig) { return "sha256=" + std::string(sig); }

TEST(GenericTest, AcceptsLowerAndUpperCaseHex) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string lower = Prefixed(kGenericHex256);
  ExpectKey(Generic(spec, {{"X-Signature", lower}, {"X-Event-Id", "e-1"}}), "e-1");
  const std::string upper = "sha256=CD05A167B42BA761892D9C7E5A30B6AF1AA654EBFFE2AB3BBA3DC7AE3E578BA7";
  ExpectKey(Generic(spec, {{"X-Signature", upper}, {"X-Event-Id", "e-1"}}), "e-1");
}

TEST(GenericTest, HeaderNamesAreCaseInsensitive) {
  GenericSpec spec = HeaderIdSpec();
  spec.header = "x-SIGNATURE";
  spec.id_header = "x-event-ID";
  const std::string sig = Prefixed(kGenericHex256);
  ExpectKey(Generic(spec, {{"X-Signature", sig}, {"X-EVENT-ID", "\te-1 "}}), "e-1");
}

TEST(GenericTest, AcceptsBase64) {
  GenericSpec spec = PointerSpec("/event/id~1x");
  spec.encoding = GenericSpec::Encoding::kBase64;
  ExpectKey(Generic(spec, {{"X-Signature", kGenericB64256}}), "ev_9");
  spec.algorithm = GenericSpec::Algorithm::kSha1;
  ExpectKey(Generic(spec, {{"X-Signature", kGenericB641}}), "ev_9");
  ExpectInvalid(Generic(spec, {{"X-Signature", kGenericB64256}}));  // a SHA-256 MAC for a SHA-1 spec
}

TEST(GenericTest, AcceptsSha1Hex) {
  GenericSpec spec = PointerSpec("/event/id~1x");
  spec.algorithm = GenericSpec::Algorithm::kSha1;
  ExpectKey(Generic(spec, {{"X-Signature", kGenericHex1}}), "ev_9");
  ExpectInvalid(Generic(spec, {{"X-Signature", kGenericHex256}}));
}

TEST(GenericTest, PrefixMustBePresentWhenSet) {
  const GenericSpec spec = HeaderIdSpec();
  ExpectInvalid(Generic(spec, {{"X-Signature", kGenericHex256}, {"X-Event-Id", "e-1"}}));
  const std::string wrong_prefix = "sha1=" + std::string(kGenericHex256);
  ExpectInvalid(Generic(spec, {{"X-Signature", wrong_prefix}, {"X-Event-Id", "e-1"}}));
}

TEST(GenericTest, NoPrefixMeansTheWholeValue) {
  GenericSpec spec = HeaderIdSpec();
  spec.prefix.clear();
  ExpectKey(Generic(spec, {{"X-Signature", kGenericHex256}, {"X-Event-Id", "e-1"}}), "e-1");
  const std::string prefixed = Prefixed(kGenericHex256);
  ExpectInvalid(Generic(spec, {{"X-Signature", prefixed}, {"X-Event-Id", "e-1"}}));
}

TEST(GenericTest, RefusesWrongSecret) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string sig = Prefixed(kGenericHex256);
  const Translation t = Generic(spec, {{"X-Signature", sig}, {"X-Event-Id", "e-1"}}, kGenericBody, "hunter2");
  ExpectInvalid(t);
  EXPECT_EQ(t.detail.find("hunter2"), std::string::npos);
  const std::string other = Prefixed(kGenericWrongHex256);
  const Translation made_with_other = Generic(spec, {{"X-Signature", other}, {"X-Event-Id", "e-1"}});
  ExpectInvalid(made_with_other);
  EXPECT_EQ(made_with_other.detail.find(kGenericSecret), std::string::npos);
}

TEST(GenericTest, RefusesTamperedBody) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string sig = Prefixed(kGenericHex256);
  ExpectInvalid(Generic(spec, {{"X-Signature", sig}, {"X-Event-Id", "e-1"}}, R"({"n":12345})"));
}

TEST(GenericTest, RefusesMissingOrRepeatedSignature) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string sig = Prefixed(kGenericHex256);
  ExpectInvalid(Generic(spec, {{"X-Event-Id", "e-1"}}));
  ExpectInvalid(Generic(spec, {{"X-Signature", sig}, {"x-signature", sig}, {"X-Event-Id", "e-1"}}));
}

TEST(GenericTest, RefusesMalformedHex) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string hex(kGenericHex256);
  for (const std::string& sig : {Prefixed(hex.substr(0, 62)), Prefixed(hex + "00"), Prefixed(hex.substr(0, 63) + "z"),
                                 Prefixed(hex.substr(0, 63)), Prefixed(""), Prefixed(kGenericB64256)}) {
    ExpectInvalid(Generic(spec, {{"X-Signature", sig}, {"X-Event-Id", "e-1"}}));
  }
}

TEST(GenericTest, RefusesMalformedBase64) {
  GenericSpec spec = PointerSpec("/n");
  spec.encoding = GenericSpec::Encoding::kBase64;
  for (const std::string_view sig : {"zQWhZ7Qrp2GJLZx+WjC2rxqmVOv/4qs7uj3Hrj5Xi6c",       // no padding
                                     "zQWhZ7Qrp2GJLZx-WjC2rxqmVOv_4qs7uj3Hrj5Xi6c=",      // URL alphabet
                                     "zQWhZ7Qrp2GJLZx+WjC2rxqmVOv/4qs7uj3Hrj5Xi6c=AAAA",  // too long
                                     "AAAAAAAAAAAAAAAAAAAAAA==", "====", ""}) {
    ExpectInvalid(Generic(spec, {{"X-Signature", sig}}));
  }
  ExpectInvalid(Generic(spec, {{"X-Signature", kGenericHex256}}));  // hex where base64 is expected
}

TEST(GenericTest, WithoutSettingsIsInvalid) {
  const Translation t =
      Translate(Provider::kGeneric, nullptr, kGenericSecret, Request(kGenericBody, {{"X-Signature", kGenericHex256}}));
  ExpectInvalid(t);
  EXPECT_EQ(t.detail, "generic provider without settings");
}

TEST(GenericTest, NeedsExactlyOneIdSource) {
  GenericSpec none = PointerSpec("");
  ExpectNoId(Generic(none, {{"X-Signature", kGenericHex256}}));
  GenericSpec two = PointerSpec("/n");
  two.id_header = "X-Event-Id";
  ExpectNoId(Generic(two, {{"X-Signature", kGenericHex256}, {"X-Event-Id", "e-1"}}));
}

TEST(GenericTest, MissingOrRepeatedIdHeaderIsNoId) {
  const GenericSpec spec = HeaderIdSpec();
  const std::string sig = Prefixed(kGenericHex256);
  ExpectNoId(Generic(spec, {{"X-Signature", sig}}));
  ExpectNoId(Generic(spec, {{"X-Signature", sig}, {"X-Event-Id", ""}}));
  ExpectNoId(Generic(spec, {{"X-Signature", sig}, {"X-Event-Id", "a"}, {"x-event-id", "b"}}));
}

TEST(GenericTest, BadSignatureWinsOverMissingId) {
  const std::string sig = Prefixed(kGenericWrongHex256);
  ExpectInvalid(Generic(HeaderIdSpec(), {{"X-Signature", sig}}));
}

TEST(GenericTest, PointerToStringsAndIntegers) {
  const std::vector<HeaderField> headers = {{"X-Signature", kGenericHex256}};
  ExpectKey(Generic(PointerSpec("/event/id~1x"), headers), "ev_9");
  ExpectKey(Generic(PointerSpec("/event/t~0k"), headers), "tilde");
  ExpectKey(Generic(PointerSpec("/n"), headers), "12345");
  ExpectKey(Generic(PointerSpec("/neg"), headers), "-7");
  ExpectKey(Generic(PointerSpec("/big"), headers), "18446744073709551615");
  ExpectKey(Generic(PointerSpec("/items/0"), headers), "a");
  ExpectKey(Generic(PointerSpec("/items/1"), headers), "b");
}

// An id is used bare: an integer is its decimal text, the same key as that
// string (docs/configuration.md says so; a sender keeps one type for its ids).
TEST(GenericTest, AnIntegerIdIsTheKeyOfItsDecimalString) {
  // printf '%s' '{"a":42,"b":"42"}' | openssl dgst -sha256 -hmac gsecret
  const std::vector<HeaderField> headers = {
      {"X-Signature", "1d93bf5216f1ceb5eab7d949064732defe4205a364db8b3cacfa7627f74aa017"}};
  ExpectKey(Generic(PointerSpec("/a"), headers, R"({"a":42,"b":"42"})"), "42");
  ExpectKey(Generic(PointerSpec("/b"), headers, R"({"a":42,"b":"42"})"), "42");
}

TEST(GenericTest, PointerToNothingUsableIsNoId) {
  const std::vector<HeaderField> headers = {{"X-Signature", kGenericHex256}};
  for (const std::string_view pointer :
       {"/missing", "/event", "/items", "/f", "/e", "/event/id/x", "/event/t~k", "/event/id~2x", "/items/2", "/items/-",
        "/items/01", "/items/+1", "/items/a", "/n/0", "n", "/event/"}) {
    ExpectNoId(Generic(PointerSpec(std::string(pointer)), headers));
  }
}

TEST(GenericTest, PointerIntoNonJsonIsNoId) {
  // printf '%s' 'not json' | openssl dgst -sha256 -hmac gsecret
  const std::vector<HeaderField> headers = {
      {"X-Signature", "b49524a8a3caa525d9e9ed4049a1fc43db168203ca39e89c0fb44d31e19cc51d"}};
  ExpectNoId(Generic(PointerSpec("/id"), headers, "not json"));
}

constexpr std::string_view kGenericForm = "account=acc_1&event=ev%5F2&empty=";
// printf '%s' 'account=acc_1&event=ev%5F2&empty=' | openssl dgst -sha256 -hmac gsecret
constexpr std::string_view kGenericFormSig = "e2bc442fd340be33638160914e1fab936ad422935c9b6879b55d7edca2b7ec56";

GenericSpec FormSpec(std::vector<std::string> fields) {
  GenericSpec spec;
  spec.header = "X-Signature";
  spec.id_form_fields = std::move(fields);
  return spec;
}

TEST(GenericTest, IdFromFormFields) {
  const std::vector<HeaderField> headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=UTF-8"},
                                            {"X-Signature", kGenericFormSig}};
  ExpectKey(Generic(FormSpec({"account", "event"}), headers, kGenericForm), "acc_1-ev_2");
  ExpectKey(Generic(FormSpec({"event"}), headers, kGenericForm), "ev_2");
}

// Joined fields cannot run into each other: "x-y" + "z" and "x" + "y-z" are
// two events, so '-' (and the escape's own '~') inside a value is escaped
// when more than one field makes the key.
TEST(GenericTest, JoinedFormFieldsKeepTheirBoundaries) {
  struct Case {
    std::string_view body, signature, key;
  };
  // printf '%s' BODY | openssl dgst -sha256 -hmac gsecret
  for (const Case& c : {Case{"a=x-y&b=z", "b85b3b39750e134e0e2dd396ea4ee86c43f7f81b6c54de93bdc4285fa50f54cc",
                             "x~2Dy-z"},
                        Case{"a=x&b=y-z", "a64d12ac194619f9ca611c4048af25a68a8643c16ef2bdbbec433b3d7d4ba489",
                             "x-y~2Dz"},
                        Case{"a=p~q&b=r", "a0679b3e147e79bc78277f1c3c2e7307df97b5d68621c7db01d8e698c8921ec2",
                             "p~7Eq-r"}}) {
    SCOPED_TRACE(c.body);
    const std::vector<HeaderField> headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                                              {"X-Signature", c.signature}};
    ExpectKey(Generic(FormSpec({"a", "b"}), headers, c.body), c.key);
  }
  // One field is the key as it is.
  const std::vector<HeaderField> one = {{"Content-Type", "application/x-www-form-urlencoded"},
                                        {"X-Signature", "b85b3b39750e134e0e2dd396ea4ee86c43f7f81b6c54de93bdc4285fa50f54cc"}};
  ExpectKey(Generic(FormSpec({"a"}), one, "a=x-y&b=z"), "x-y");
}

TEST(GenericTest, MissingOrEmptyFormFieldIsNoId) {
  const std::vector<HeaderField> headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                                            {"X-Signature", kGenericFormSig}};
  ExpectNoId(Generic(FormSpec({"account", "missing"}), headers, kGenericForm));
  ExpectNoId(Generic(FormSpec({"account", "empty"}), headers, kGenericForm));
}

TEST(GenericTest, FormFieldsNeedAFormBody) {
  const std::vector<HeaderField> headers = {{"Content-Type", "text/plain"}, {"X-Signature", kGenericFormSig}};
  ExpectNoId(Generic(FormSpec({"account"}), headers, kGenericForm));
}

}  // namespace
}  // namespace idemgate::webhooks
