// Integration tests of webhook routes (SPEC §7): the real idemgate binary in
// front of fake_upstream, with signed requests from Stripe, GitHub, Twilio
// and a generic sender. The signatures are made here with OpenSSL directly;
// tests/webhook checks each provider's rules against published and
// independently computed vectors.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/digest.h"
#include "common/hex.h"
#include "integration/harness.h"

namespace idemgate::testing {
namespace {

namespace json = boost::json;

// The raw HMAC of `data` under `key`.
std::string Mac(const EVP_MD* md, const std::string& key, const std::string& data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(md, key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       mac, &n);
  return std::string(reinterpret_cast<const char*>(mac), n);
}

std::string Base64(const std::string& bytes) {
  unsigned char out[128];
  const int len =
      EVP_EncodeBlock(out, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  return std::string(reinterpret_cast<const char*>(out), static_cast<std::size_t>(len));
}

std::string HmacSha256Hex(const std::string& key, const std::string& data) {
  return ToHex(Mac(EVP_sha256(), key, data));
}

std::string HmacSha1Base64(const std::string& key, const std::string& data) {
  return Base64(Mac(EVP_sha1(), key, data));
}

std::int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr char kStripeSecret[] = "whsec_integration";
constexpr char kGithubSecret[] = "github-secret";
constexpr char kTwilioToken[] = "twilio-token";
constexpr char kGenericSecret[] = "generic-secret";
// "whsec_" + base64("secret-key-for-idemgate-tests")
constexpr char kSwSecret[] = "whsec_c2VjcmV0LWtleS1mb3ItaWRlbWdhdGUtdGVzdHM=";
constexpr char kSwKey[] = "secret-key-for-idemgate-tests";

class WebhookTest : public GatewaySuite {
 protected:
  std::string Yaml(const std::string& identity = "{ mode: none }") {
    std::ostringstream y;
    y << GatewayConfigHead(fake_endpoint_, {.identity = identity})
      << "  - id: stripe-hooks\n"
      << "    match: { path: \"/echo/stripe/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: stripe }\n"
      << "  - id: github-hooks\n"
      << "    match: { path: \"/echo/github/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: github }\n"
      << "  - id: twilio-hooks\n"
      << "    match: { path: \"/echo/twilio/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: twilio }\n"
      << "  - id: twilio-es-hooks\n"
      << "    match: { path: \"/echo/twilio-es/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: twilio_event_streams }\n"
      << "  - id: generic-hooks\n"
      << "    match: { path: \"/echo/generic/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: generic }\n"
      << "  - id: sw-hooks\n"
      << "    match: { path: \"/echo/sw/{webhook_id}\" }\n"
      << "    upstream: fake\n"
      << "    idempotency: { policy: webhook, provider: standard_webhooks }\n"
      << "  - id: api\n"
      << "    match: { path_prefix: / }\n"
      << "    upstream: fake\n"
      << "webhooks:\n"
      << "  endpoints:\n"
      << "    - { id: acme, tenant: acme, project: shop, provider: stripe, secret_env: STRIPE_SECRET }\n"
      << "    - { id: acme-next, tenant: acme, project: shop, provider: stripe, secret_env: STRIPE_SECRET }\n"
      << "    - { id: globex, tenant: globex, project: web, provider: stripe, secret_file: " << secret_file_
      << " }\n"
      << "    - { id: acme-gh, tenant: acme, project: ci, provider: github, secret_env: GITHUB_SECRET }\n"
      << "    - { id: acme-sms, tenant: acme, project: sms, provider: twilio, secret_env: TWILIO_TOKEN,\n"
      << "        public_url: \"https://hooks.example.com\" }\n"
      << "    - { id: acme-sms-fwd, tenant: acme, project: sms, provider: twilio, secret_env: TWILIO_TOKEN }\n"
      << "    - { id: acme-es, tenant: acme, project: events, provider: twilio_event_streams,\n"
      << "        secret_env: TWILIO_TOKEN, public_url: \"https://hooks.example.com\" }\n"
      << "    - id: acme-generic\n"
      << "      tenant: acme\n"
      << "      project: misc\n"
      << "      provider: generic\n"
      << "      secret_env: GENERIC_SECRET\n"
      << "      generic: { header: X-Signature, prefix: \"sha256=\", id_pointer: /event/id }\n"
      << "    - { id: acme-sw, tenant: acme, project: notify, provider: standard_webhooks, secret_env: SW_SECRET }\n";
    return y.str();
  }

  // Every endpoint's secret, as the environment holds them.
  static std::vector<std::pair<std::string, std::string>> Secrets() {
    return {{"STRIPE_SECRET", kStripeSecret},
            {"GITHUB_SECRET", kGithubSecret},
            {"TWILIO_TOKEN", kTwilioToken},
            {"GENERIC_SECRET", kGenericSecret},
            {"SW_SECRET", kSwSecret}};
  }

  void WriteSecretFile() {
    std::ofstream f(secret_file_);
    f << "whsec_from_file\n";
  }

  void Start(const std::string& identity = "{ mode: none }") {
    WriteSecretFile();
    StartGateway(Yaml(identity), Secrets());
  }

  // A start with `env` in place of Secrets(), expected to fail.
  Status FailedStart(std::vector<std::pair<std::string, std::string>> env) {
    WriteSecretFile();
    auto g = GatewayProcess::Start(dir_, Yaml(), std::move(env));
    return g.ok() ? InternalError("the gateway started") : g.status();
  }

  static HttpRequest StripeEvent(const std::string& endpoint, const std::string& secret, const std::string& body,
                                 std::int64_t t = NowSeconds()) {
    const std::string ts = std::to_string(t);
    HttpRequest req{.method = "POST", .target = "/echo/stripe/" + endpoint};
    req.headers = {{"Content-Type", "application/json"},
                   {"Stripe-Signature", "t=" + ts + ",v1=" + HmacSha256Hex(secret, ts + "." + body)}};
    req.body = body;
    return req;
  }

  std::string secret_file_ = dir_.Join("globex.secret");
};

TEST_F(WebhookTest, StripeEventRunsOnceAndItsRetryIsReplayedUnderTheEndpointsScope) {
  Start();
  const std::string body = R"({"id":"evt_1Nq","type":"payment_intent.succeeded","data":{"object":{}}})";
  const HttpResponse first = Send(StripeEvent("acme", kStripeSecret, body));
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
  auto echo = ParseObject(first.body);
  // The key is the event's id, scoped by the endpoint's tenant and project.
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:shop:service:webhook-ingest:stripe-hooks/acme:stripe-evt_1Nq\""}));

  // Stripe retries the same event with a fresh signature and timestamp.
  const HttpResponse retry = Send(StripeEvent("acme", kStripeSecret, body, NowSeconds() - 5));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retry.body, first.body);
  EXPECT_EQ(Executions(), 1u);

  // The same event id at another endpoint (another tenant, its own secret
  // read from a file) is another key.
  const HttpResponse other = Send(StripeEvent("globex", "whsec_from_file", body));
  EXPECT_EQ(other.status, 200) << other.body;
  EXPECT_FALSE(other.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(WebhookTest, BadSignaturesAreRefusedBeforeTheUpstream) {
  Start();
  const std::string body = R"({"id":"evt_2"})";
  ExpectProblem(Send(StripeEvent("acme", "whsec_wrong", body)), 401, "signature-invalid");
  // Signed for another endpoint's secret.
  ExpectProblem(Send(StripeEvent("acme", "whsec_from_file", body)), 401, "signature-invalid");
  // Outside Stripe's 300-second tolerance.
  ExpectProblem(Send(StripeEvent("acme", kStripeSecret, body, NowSeconds() - 1000)), 401, "signature-invalid");
  // The body changed after signing.
  HttpRequest tampered = StripeEvent("acme", kStripeSecret, body);
  tampered.body = R"({"id":"evt_3"})";
  ExpectProblem(Send(tampered), 401, "signature-invalid");
  // No signature at all.
  HttpRequest unsigned_post = StripeEvent("acme", kStripeSecret, body);
  unsigned_post.headers.pop_back();
  ExpectProblem(Send(unsigned_post), 401, "signature-invalid");
  EXPECT_EQ(Executions(), 0u);
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics,
                        R"(transport_translation_failed_total{tenant="acme",project="shop",route="stripe-hooks",provider="stripe"})"),
            5.0)
      << metrics;
}

// No signature covers the method: a signed event re-sent with a method the
// route does not deduplicate would be verified and forwarded without a key,
// and run again each time. Such methods are refused before anything else.
TEST_F(WebhookTest, MethodsTheRouteDoesNotDeduplicateAreRefused) {
  Start();
  const std::string body = R"({"id":"evt_method"})";
  for (const std::string method : {"PUT", "DELETE", "GET", "OPTIONS"}) {
    SCOPED_TRACE(method);
    HttpRequest resent = StripeEvent("acme", kStripeSecret, body);
    resent.method = method;
    const HttpResponse res = Send(resent);
    ExpectProblem(res, 405, "method-not-allowed");
    EXPECT_EQ(res.Header("Allow"), "POST, PATCH");
  }
  EXPECT_EQ(Executions(), 0u);
  ASSERT_EQ(Send(StripeEvent("acme", kStripeSecret, body)).status, 200);
  HttpRequest resent = StripeEvent("acme", kStripeSecret, body);
  resent.method = "PUT";
  ExpectProblem(Send(resent), 405, "method-not-allowed");
  EXPECT_EQ(Executions(), 1u);
  // An id that names no endpoint is still an unknown path, whatever the method.
  HttpRequest unknown = StripeEvent("nobody", kStripeSecret, body);
  unknown.method = "PUT";
  ExpectProblem(Send(unknown), 404, "no-route");
}

// Another spelling of a webhook path (an encoded letter, doubled slashes)
// is the same path to most upstreams: it is matched as the webhook route
// and verified, never passed unsigned through the catch-all route.
TEST_F(WebhookTest, OtherSpellingsOfAWebhookPathAreStillVerified) {
  Start();
  const std::string body = R"({"id":"evt_spelled"})";
  for (const std::string target : {"/echo/%73tripe/acme", "//echo/stripe/acme", "/echo//stripe//acme",
                                   "/echo/stripe/%61cme", "/%65cho/stripe/acme", "/echo/stripe/acme/",
                                   "/echo/stripe/acme//"}) {
    SCOPED_TRACE(target);
    HttpRequest forged = StripeEvent("acme", "whsec_wrong", body);
    forged.target = target;
    ExpectProblem(Send(forged), 401, "signature-invalid");
  }
  EXPECT_EQ(Executions(), 0u);
  // Signed properly, such a spelling is the webhook route's request, and the
  // upstream gets the path that was routed.
  HttpRequest spelled = StripeEvent("acme", kStripeSecret, body);
  spelled.target = "//echo/%73tripe/acme";
  const HttpResponse first = Send(spelled);
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(std::string(echo.at("target").as_string()), "/echo/stripe/acme");
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:shop:service:webhook-ingest:stripe-hooks/acme:stripe-evt_spelled\""}));
  EXPECT_EQ(Send(StripeEvent("acme", kStripeSecret, body)).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(WebhookTest, AVerifiedEventWithoutAnIdIsATranslationFailure) {
  Start();
  ExpectProblem(Send(StripeEvent("acme", kStripeSecret, R"({"type":"ping"})")), 400, "translation-failed");
  // An id that cannot be a key (a colon would forge a scope).
  ExpectProblem(Send(StripeEvent("acme", kStripeSecret, R"({"id":"evt:1"})")), 400, "translation-failed");
  EXPECT_EQ(Executions(), 0u);
}

TEST_F(WebhookTest, UnknownEndpointsAreNotFound) {
  Start();
  const std::string body = R"({"id":"evt_4"})";
  ExpectProblem(Send(StripeEvent("nobody", kStripeSecret, body)), 404, "no-route");
  // acme-gh exists, but for GitHub: on the Stripe route it is unknown.
  ExpectProblem(Send(StripeEvent("acme-gh", kGithubSecret, body)), 404, "no-route");
  // Like any unknown path (SPEC §7) in the log, the metrics and the stats
  // too: no route, no idempotency policy.
  std::vector<json::object> lines;
  ASSERT_TRUE(PollUntil(
      [&] {
        lines.clear();
        std::istringstream text(gateway_->Stdout());
        for (std::string line; std::getline(text, line);) {
          if (line.find("\"msg\":\"request\"") != std::string::npos) lines.push_back(json::parse(line).as_object());
        }
        return lines.size() >= 2;
      },
      5s));
  for (const json::object& line : lines) {
    SCOPED_TRACE(json::serialize(line));
    EXPECT_TRUE(line.at("route").is_null());
    EXPECT_TRUE(line.at("idempotency_policy").is_null());
    EXPECT_EQ(line.at("outcome").as_string(), "no_route");
  }
  EXPECT_EQ(
      MetricValue(Metrics(), R"(idemgate_request_duration_seconds_count{tenant="_",project="_",route="stripe-hooks"})")
          .value_or(0),
      0.0);
  auto stats = SendRequest(gateway_->admin(), HttpRequest{.target = "/admin/stats"});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(ParseObject(stats->body).at("routes").at("stripe-hooks").at("requests").as_int64(), 0) << stats->body;
  // The id is one whole segment: an exact-path route takes nothing below it.
  HttpRequest deeper = StripeEvent("acme", kStripeSecret, body);
  deeper.target = "/echo/stripe/acme/extra";
  const HttpResponse res = Send(deeper);
  // Not the webhook route: the catch-all route proxies it, unverified and unkeyed.
  EXPECT_EQ(res.status, 200);
  EXPECT_FALSE(res.HasHeader("Idempotent-Replayed"));
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(WebhookTest, GithubDeliveryIsTheKey) {
  Start();
  const std::string body = R"({"action":"opened","number":7})";
  HttpRequest req{.method = "POST", .target = "/echo/github/acme-gh"};
  req.headers = {{"Content-Type", "application/json"},
                 {"X-GitHub-Event", "pull_request"},
                 {"X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
                 {"X-Hub-Signature-256", "sha256=" + HmacSha256Hex(kGithubSecret, body)}};
  req.body = body;
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{
                "\"t-acme:ci:service:webhook-ingest:github-hooks/acme-gh:github-72d3162e-cc78-11e3-81ab-4c9367dc0958\""}));
  const HttpResponse again = Send(req);
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);

  req.headers[3].value = "sha256=" + HmacSha256Hex("other", body);
  ExpectProblem(Send(req), 401, "signature-invalid");
}

TEST_F(WebhookTest, TwilioSignsThePublicUrlAndSortedFormParameters) {
  Start();
  // Twilio signs the URL it called (public_url + path) followed by the
  // parameters sorted by name; the body sends them in another order.
  const std::string body = "To=%2B15557654321&MessageStatus=delivered&MessageSid=SM123&From=%2B15551234567";
  const std::string signed_text =
      "https://hooks.example.com/echo/twilio/acme-sms"
      "From+15551234567MessageSidSM123MessageStatusdeliveredTo+15557654321";
  HttpRequest req{.method = "POST", .target = "/echo/twilio/acme-sms"};
  req.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                 {"X-Twilio-Signature", HmacSha1Base64(kTwilioToken, signed_text)}};
  req.body = body;
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:sms:service:webhook-ingest:twilio-hooks/acme-sms:twilio-SM123-delivered\""}));
  EXPECT_EQ(Send(req).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);

  // Twilio signs the URL as it called it: a path the gateway normalises
  // for routing ("%2D" is '-') is still verified as received.
  const std::string spelled_text = "https://hooks.example.com/echo/twilio/acme%2Dsms" +
                                   signed_text.substr(signed_text.find("From"));
  HttpRequest spelled{.method = "POST", .target = "/echo/twilio/acme%2Dsms"};
  spelled.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                     {"X-Twilio-Signature", HmacSha1Base64(kTwilioToken, spelled_text)}};
  spelled.body = body;
  EXPECT_EQ(Send(spelled).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);

  // Signed for the URL the gateway itself is reached at: not what Twilio called.
  req.headers[1].value = HmacSha1Base64(kTwilioToken, "http://127.0.0.1/echo/twilio/acme-sms" +
                                                          signed_text.substr(signed_text.find("From")));
  ExpectProblem(Send(req), 401, "signature-invalid");
}

// Twilio's signature does not cover where the form's fields are cut: a
// captured delivery sent again cut elsewhere, under its signature, gets the
// original's answer (or a refusal), never a second run under another key.
TEST_F(WebhookTest, TwilioDeliveryRecutUnderItsSignatureIsNotRunAgain) {
  Start();
  const std::string sid = "SM" + std::string(32, 'c');
  const std::string signed_text = "https://hooks.example.com/echo/twilio/acme-sms" + ("MessageSid" + sid) +
                                  "MessageStatusdelivered" + ("SmsSid" + sid) + "SmsStatusdelivered" + "To+15551234567";
  const auto delivery = [&](const std::string& body) {
    HttpRequest req{.method = "POST", .target = "/echo/twilio/acme-sms"};
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                   {"X-Twilio-Signature", HmacSha1Base64(kTwilioToken, signed_text)}};
    req.body = body;
    return req;
  };
  const HttpResponse first = Send(delivery("MessageSid=" + sid + "&MessageStatus=delivered&SmsSid=" + sid +
                                           "&SmsStatus=delivered&To=%2B15551234567"));
  ASSERT_EQ(first.status, 200) << first.body;
  for (const std::string& recut :
       {"MessageSid=" + sid + "&MessageStatus=deliveredSmsSid" + sid + "SmsStatusdelivered&To=%2B15551234567",
        "MessageSid=" + sid + "&MessageStatus=deliv&eredSmsSid" + sid + "SmsStatusdeliveredTo=%2B15551234567",
        "MessageSid=" + sid + "&MessageStatusdel=ivered&SmsSid=" + sid + "&SmsStatus=delivered&To=%2B15551234567",
        "MessageSid=" + sid + "&MessageStatus=delivered&SmsSid=" + sid + "Sms&StatusdeliveredTo=%2B15551234567"}) {
    SCOPED_TRACE(recut);
    const HttpResponse again = Send(delivery(recut));
    // The original's key: its answer, or 422 for a body that is not the
    // original's bytes; never a second run.
    ExpectProblem(again, 422, "key-reused");
  }
  EXPECT_EQ(Executions(), 1u);
}

// Only a scheme and a host[:port] are taken from the forwarding headers: any
// other text there (a path, a query) would be signed URL text of the
// sender's choosing, so the signed text would not say where the URL ends.
TEST_F(WebhookTest, TwilioForwardingHeadersGiveOnlyASchemeAndAHost) {
  Start();
  const std::string body = "MessageStatus=sent&MessageSid=SM777";
  const std::string params = "MessageSidSM777MessageStatussent";
  const std::string path = "/echo/twilio/acme-sms-fwd";
  for (const auto& [proto, host, signed_url] :
       {std::tuple<std::string, std::string, std::string>{"https", "hooks.example.com/x",
                                                          "https://hooks.example.com/x" + path},
        {"https://hooks.example.com/y?", "hooks.example.com", "https://hooks.example.com/y?://hooks.example.com" + path}}) {
    SCOPED_TRACE(proto + " " + host);
    HttpRequest req{.method = "POST", .target = path};
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                   {"X-Forwarded-Proto", proto},
                   {"X-Forwarded-Host", host},
                   {"X-Twilio-Signature", HmacSha1Base64(kTwilioToken, signed_url + params)}};
    req.body = body;
    ExpectProblem(Send(req), 401, "signature-invalid");
  }
  EXPECT_EQ(Executions(), 0u);
}

// Without public_url the signed URL is what the proxy in front reports: its
// scheme in any case (Twilio signs "https"), and its host with a port that
// Twilio may have left out of what it signed.
TEST_F(WebhookTest, TwilioWithoutPublicUrlSignsTheForwardedSchemeAndHost) {
  Start();
  const std::string body = "MessageStatus=sent&MessageSid=SM777";
  const std::string params = "MessageSidSM777MessageStatussent";
  HttpRequest req{.method = "POST", .target = "/echo/twilio/acme-sms-fwd"};
  req.headers = {{"Content-Type", "application/x-www-form-urlencoded"},
                 {"X-Forwarded-Proto", "HTTPS"},
                 {"X-Forwarded-Host", "hooks.example.com"},
                 {"X-Twilio-Signature",
                  HmacSha1Base64(kTwilioToken, "https://hooks.example.com/echo/twilio/acme-sms-fwd" + params)}};
  req.body = body;
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  // Called on another port, signed without it.
  req.headers[2].value = "hooks.example.com:8443";
  EXPECT_EQ(Send(req).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

// Twilio signs a body that is not a form only through the URL's bodySHA256:
// a signature over the URL alone covers no such body.
TEST_F(WebhookTest, TwilioEventStreamsBodyMustBeSignedThroughBodySha256) {
  Start();
  const std::string body = R"([{"type":"com.twilio.messaging.message.delivered","id":"EZ1"}])";
  const std::string url = "https://hooks.example.com/echo/twilio-es/acme-es";
  HttpRequest unsigned_body{.method = "POST", .target = "/echo/twilio-es/acme-es"};
  unsigned_body.headers = {{"Content-Type", "application/json"},
                           {"I-Twilio-Idempotency-Token", "idem-1"},
                           {"X-Twilio-Signature", HmacSha1Base64(kTwilioToken, url)}};
  unsigned_body.body = body;
  const HttpResponse refused = Send(unsigned_body);
  ExpectProblem(refused, 401, "signature-invalid");
  EXPECT_NE(refused.body.find("bodySHA256"), std::string::npos) << refused.body;
  EXPECT_EQ(Executions(), 0u);

  const std::string query = "?bodySHA256=" + Sha256Hex(body);
  HttpRequest signed_body = unsigned_body;
  signed_body.target += query;
  signed_body.headers[2].value = HmacSha1Base64(kTwilioToken, url + query);
  const HttpResponse ok = Send(signed_body);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(WebhookTest, GenericSenderWithAJsonPointerId) {
  Start();
  const std::string body = R"({"event":{"id":"e-77","kind":"invoice.paid"}})";
  HttpRequest req{.method = "POST", .target = "/echo/generic/acme-generic"};
  req.headers = {{"Content-Type", "application/json"},
                 {"X-Signature", "sha256=" + HmacSha256Hex(kGenericSecret, body)}};
  req.body = body;
  const HttpResponse first = Send(req);
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:misc:service:webhook-ingest:generic-hooks/acme-generic:e-77\""}));
  EXPECT_EQ(Send(req).Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
}

// A generic id is the key as it is (docs/configuration.md): one starting with
// the reserved "t-" is refused, and an integer is the key of its decimal text.
TEST_F(WebhookTest, GenericIdsAreBareKeys) {
  Start();
  const auto event = [](const std::string& body) {
    HttpRequest req{.method = "POST", .target = "/echo/generic/acme-generic"};
    req.headers = {{"Content-Type", "application/json"},
                   {"X-Signature", "sha256=" + HmacSha256Hex(kGenericSecret, body)}};
    req.body = body;
    return req;
  };
  ExpectProblem(Send(event(R"({"event":{"id":"t-9"}})")), 400, "translation-failed");
  EXPECT_EQ(Send(event(R"({"event":{"id":42}})")).status, 200);
  ExpectProblem(Send(event(R"({"event":{"id":"42"}})")), 422, "key-reused");
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(WebhookTest, WithTrustedHeadersTheEndpointIsTheIdentityAndSenderHeadersAreReplaced) {
  Start("{ mode: trusted_headers }");
  // A sender carries no identity headers: the webhook route does not ask for them.
  HttpRequest req = StripeEvent("acme", kStripeSecret, R"({"id":"evt_5"})");
  // And cannot forge them.
  req.headers.push_back({"X-Tenant-Id", "globex"});
  const HttpResponse res = Send(req);
  ASSERT_EQ(res.status, 200) << res.body;
  ExpectUpstreamIdentity(res, "acme", "shop", "service:webhook-ingest");
  // Other routes still require the identity headers.
  ExpectProblem(Send(KeyedPost("/echo/pay", "k1")), 401, "unauthenticated");
}

// With no identity mode, as with any: the upstream learns the endpoint's
// caller, never what the sender wrote in those headers (the signature does
// not cover them), in any spelling.
TEST_F(WebhookTest, TheEndpointIsTheIdentityInEveryModeAndSenderHeadersAreReplaced) {
  Start();
  HttpRequest req = StripeEvent("acme", kStripeSecret, R"({"id":"evt_forged_identity"})");
  req.headers.push_back({"X-Tenant-Id", "globex"});
  req.headers.push_back({"X-Subject", "user:root"});
  req.headers.push_back({"X_Tenant_Id", "globex"});
  req.headers.push_back({"x-project_id", "web"});
  const HttpResponse res = Send(req);
  ASSERT_EQ(res.status, 200) << res.body;
  ExpectUpstreamIdentity(res, "acme", "shop", "service:webhook-ingest");
  auto echo = ParseObject(res.body);
  const auto headers = EchoedHeaders(echo);
  EXPECT_TRUE(Values(headers, "X_Tenant_Id").empty());
  EXPECT_TRUE(Values(headers, "x-project_id").empty());
}

// With identity.mode api_key, a webhook route reads no API key (the
// signature identifies the sender), and what a caller sent as one is not
// forwarded there either, as on every other route.
TEST_F(WebhookTest, WithApiKeysNoKeyReachesTheUpstreamFromAWebhookRoute) {
  {
    std::ofstream f(dir_.Join("keys.yaml"));
    f << "keys:\n  - { sha256: " << Sha256Hex("k_live_acme") << ", tenant: acme, project: shop, subject: app }\n";
  }
  Start("{ mode: api_key, api_key: { keys_file: " + dir_.Join("keys.yaml") + " } }");
  HttpRequest req = StripeEvent("acme", kStripeSecret, R"({"id":"evt_with_api_key"})");
  req.headers.push_back({"X-API-Key", "k_live_acme"});
  req.headers.push_back({"X_API_Key", "k_live_acme"});
  req.headers.push_back({"Authorization", "Bearer k_live_acme"});
  const HttpResponse res = Send(req);
  ASSERT_EQ(res.status, 200) << res.body;
  auto echo = ParseObject(res.body);
  const auto headers = EchoedHeaders(echo);
  EXPECT_TRUE(Values(headers, "X-API-Key").empty());
  EXPECT_TRUE(Values(headers, "X_API_Key").empty());
  EXPECT_TRUE(Values(headers, "Authorization").empty());
  ExpectUpstreamIdentity(res, "acme", "shop", "service:webhook-ingest");

  // Credentials of another scheme are the sender's business and pass.
  HttpRequest basic = StripeEvent("acme", kStripeSecret, R"({"id":"evt_with_basic"})");
  basic.headers.push_back({"Authorization", "Basic dHdpbGlvOnB3"});
  const HttpResponse passed = Send(basic);
  ASSERT_EQ(passed.status, 200) << passed.body;
  auto echo2 = ParseObject(passed.body);
  EXPECT_EQ(Values(EchoedHeaders(echo2), "Authorization"), (std::vector<std::string>{"Basic dHdpbGlvOnB3"}));
}

// One event sent to two endpoints of one tenant (an endpoint being replaced
// by another, both registered with the sender) is a delivery to each: each
// runs once and each retry is replayed, rather than the second being a key
// reused with another payload (its path names the other endpoint).
TEST_F(WebhookTest, EachEndpointKeepsItsOwnKeys) {
  Start();
  const std::string body = R"({"id":"evt_both"})";
  for (const std::string endpoint : {"acme", "acme-next"}) {
    SCOPED_TRACE(endpoint);
    const HttpResponse first = Send(StripeEvent(endpoint, kStripeSecret, body));
    ASSERT_EQ(first.status, 200) << first.body;
    EXPECT_FALSE(first.HasHeader("Idempotent-Replayed"));
    auto echo = ParseObject(first.body);
    EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
              (std::vector<std::string>{"\"t-acme:shop:service:webhook-ingest:stripe-hooks/" + endpoint +
                                        ":stripe-evt_both\""}));
    const HttpResponse retry = Send(StripeEvent(endpoint, kStripeSecret, body));
    EXPECT_EQ(retry.status, 200) << retry.body;
    EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  }
  EXPECT_EQ(Executions(), 2u);
}

TEST_F(WebhookTest, ASecretRotatedInItsFileTakesEffectOnReload) {
  Start();
  const std::string body = R"({"id":"evt_rot"})";
  ASSERT_EQ(Send(StripeEvent("globex", "whsec_from_file", body)).status, 200);
  {
    std::ofstream f(secret_file_);
    f << "whsec_rotated\n";
  }
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  // The reload is asynchronous: wait until the new secret is accepted.
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = Send(StripeEvent("globex", "whsec_rotated", R"({"id":"evt_rot2"})")).status;
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);
  ExpectProblem(Send(StripeEvent("globex", "whsec_from_file", R"({"id":"evt_rot3"})")), 401, "signature-invalid");
  // A reload whose secret cannot be read keeps the running config.
  std::filesystem::remove(secret_file_);
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(Send(StripeEvent("globex", "whsec_rotated", R"({"id":"evt_rot4"})")).status, 200);
  EXPECT_NE(gateway_->Stdout().find("secret_file"), std::string::npos);
}

TEST_F(WebhookTest, EndpointsFromWebhooksFileServeAndAReloadRereadsThem) {
  const std::string file = dir_.Join("endpoints.yaml");
  auto write = [&file](const std::string& text) {
    std::ofstream f(file);
    f << text;
  };
  write("endpoints:\n  - { id: initech, tenant: initech, project: billing, provider: stripe, secret_env: STRIPE_SECRET }\n");
  WriteSecretFile();
  StartGateway(Yaml() + "  file: " + file + "\n", Secrets());
  const std::string body = R"({"id":"evt_filed"})";
  const HttpResponse first = Send(StripeEvent("initech", kStripeSecret, body));
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-initech:billing:service:webhook-ingest:stripe-hooks/initech:stripe-evt_filed\""}));
  EXPECT_EQ(Send(StripeEvent("initech", kStripeSecret, body)).Header("Idempotent-Replayed"), "true");
  // The inline endpoints still serve beside the file's.
  EXPECT_EQ(Send(StripeEvent("acme", kStripeSecret, body)).status, 200);
  EXPECT_EQ(Executions(), 2u);

  // A reload reads the file again: an endpoint added there serves, one taken out is gone.
  write("endpoints:\n  - { id: initech-eu, tenant: initech, project: eu, provider: stripe, secret_env: STRIPE_SECRET }\n");
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    status = Send(StripeEvent("initech-eu", kStripeSecret, R"({"id":"evt_eu"})")).status;
    if (status != 200) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(status, 200);
  ExpectProblem(Send(StripeEvent("initech", kStripeSecret, R"({"id":"evt_gone"})")), 404, "no-route");

  // A file that no longer loads keeps the running endpoints, and the log names the file's line.
  write("endpoints:\n  - { id: initech-eu, tenant: initech, project: eu, provider: paypal, secret_env: STRIPE_SECRET }\n");
  ASSERT_TRUE(gateway_->process().Signal(SIGHUP).ok());
  std::string log;
  for (int i = 0; i < 100 && log.find("paypal") == std::string::npos; ++i) {
    std::this_thread::sleep_for(50ms);
    log = gateway_->Stdout();
  }
  EXPECT_NE(log.find(file + ":2: endpoints[0].provider: unknown provider"), std::string::npos) << log;
  EXPECT_EQ(Send(StripeEvent("initech-eu", kStripeSecret, R"({"id":"evt_eu2"})")).status, 200);
}

HttpRequest StandardWebhook(const std::string& id, const std::string& body, const std::string& key = kSwKey) {
  const std::string ts = std::to_string(NowSeconds());
  HttpRequest req{.method = "POST", .target = "/echo/sw/acme-sw"};
  req.headers = {{"Content-Type", "application/json"},
                 {"webhook-id", id},
                 {"webhook-timestamp", ts},
                 {"webhook-signature", "v1," + Base64(Mac(EVP_sha256(), key, id + "." + ts + "." + body))}};
  req.body = body;
  return req;
}

TEST_F(WebhookTest, StandardWebhooksMessageRunsOnceUnderItsId) {
  Start();
  const std::string body = R"({"type":"invoice.paid","data":{"id":"in_1"}})";
  const HttpResponse first = Send(StandardWebhook("msg_2Lh9", body));
  ASSERT_EQ(first.status, 200) << first.body;
  auto echo = ParseObject(first.body);
  EXPECT_EQ(Values(EchoedHeaders(echo), "Idempotency-Key"),
            (std::vector<std::string>{"\"t-acme:notify:service:webhook-ingest:sw-hooks/acme-sw:webhook-msg_2Lh9\""}));
  // The sender's retry carries the same id with a new timestamp and signature.
  std::this_thread::sleep_for(1100ms);
  const HttpResponse retry = Send(StandardWebhook("msg_2Lh9", body));
  EXPECT_EQ(retry.status, 200);
  EXPECT_EQ(retry.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(Executions(), 1u);
  ExpectProblem(Send(StandardWebhook("msg_forged", body, "another-key")), 401, "signature-invalid");
  EXPECT_EQ(Executions(), 1u);
}

// A correctly signed id the gateway does not take is not a signature failure:
// the sender sees 400 translation-failed, with the reason.
TEST_F(WebhookTest, AStandardWebhooksIdWithADotOrEmptyIsATranslationFailure) {
  Start();
  const std::string body = R"({"type":"invoice.paid"})";
  const HttpResponse dotted = Send(StandardWebhook("msg.3", body));
  ExpectProblem(dotted, 400, "translation-failed");
  EXPECT_NE(dotted.body.find("holds a '.'"), std::string::npos) << dotted.body;
  const HttpResponse empty = Send(StandardWebhook("", body));
  ExpectProblem(empty, 400, "translation-failed");
  EXPECT_NE(empty.body.find("webhook-id is empty"), std::string::npos) << empty.body;
  ExpectProblem(Send(StandardWebhook("msg.3", body, "another-key")), 401, "signature-invalid");
  EXPECT_EQ(Executions(), 0u);
}

TEST_F(WebhookTest, AStandardWebhooksSecretThatIsNotBase64StopsTheStart) {
  auto env = Secrets();
  env.back() = {"SW_SECRET", "whsec_not base64"};
  const Status s = FailedStart(env);
  EXPECT_NE(s.ToString().find("standard_webhooks secret"), std::string::npos) << s.ToString();
}

TEST_F(WebhookTest, AMissingSecretStopsTheStart) {
  auto env = Secrets();
  env.erase(env.begin());  // STRIPE_SECRET
  const Status s = FailedStart(env);
  EXPECT_NE(s.ToString().find("STRIPE_SECRET"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace idemgate::testing
