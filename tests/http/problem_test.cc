#include "http/problem.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <set>

namespace idemgate::http {
namespace {

namespace json = boost::json;

constexpr ProblemCode kAll[] = {
    ProblemCode::kMissingKey,       ProblemCode::kInvalidKey,          ProblemCode::kKeyProhibited,
    ProblemCode::kKeyReused,        ProblemCode::kRequestInFlight,     ProblemCode::kTranslationFailed,
    ProblemCode::kSignatureInvalid, ProblemCode::kUnauthenticated,     ProblemCode::kTooManyRequests,
    ProblemCode::kStoreUnavailable, ProblemCode::kUpstreamUnavailable, ProblemCode::kUpstreamTimeout,
    ProblemCode::kRequestTooLarge,  ProblemCode::kNoRoute,             ProblemCode::kNotFound,
    ProblemCode::kBadRequest,       ProblemCode::kHeadersTooLarge,     ProblemCode::kShuttingDown,
    ProblemCode::kUriTooLong,       ProblemCode::kRequestTimeout,      ProblemCode::kInternal,
    ProblemCode::kMethodNotAllowed,
};

TEST(ProblemTest, TransportCodesBeyondTheSpec) {
  EXPECT_EQ(ProblemCodeName(ProblemCode::kUriTooLong), "uri-too-long");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kUriTooLong), 414);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kRequestTimeout), "request-timeout");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kRequestTimeout), 408);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kMethodNotAllowed), "method-not-allowed");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kMethodNotAllowed), 405);
}

TEST(ProblemTest, SpecCodesAndStatuses) {
  EXPECT_EQ(ProblemCodeName(ProblemCode::kMissingKey), "missing-key");
  EXPECT_EQ(ProblemCodeName(ProblemCode::kKeyReused), "key-reused");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kKeyReused), 422);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kRequestInFlight), "request-in-flight");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kRequestInFlight), 409);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kTooManyRequests), "too-many-requests");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kTooManyRequests), 429);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kUpstreamUnavailable), "upstream-unavailable");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kUpstreamUnavailable), 502);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kUpstreamTimeout), "upstream-timeout");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kUpstreamTimeout), 504);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kRequestTooLarge), "request-too-large");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kRequestTooLarge), 413);
  EXPECT_EQ(ProblemCodeName(ProblemCode::kNoRoute), "no-route");
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kNoRoute), 404);
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kStoreUnavailable), 503);
  EXPECT_EQ(ProblemDefaultStatus(ProblemCode::kUnauthenticated), 401);
}

TEST(ProblemTest, EveryCodeSerialisesTheRfc9457Shape) {
  std::set<std::string_view> names;
  for (ProblemCode code : kAll) {
    const std::string_view name = ProblemCodeName(code);
    EXPECT_TRUE(names.insert(name).second) << "duplicate " << name;
    const std::string body = ProblemJson(code, "detail \"quoted\"\n");
    boost::system::error_code ec;
    json::value v = json::parse(body, ec);
    ASSERT_FALSE(ec) << body;
    const json::object& o = v.as_object();
    EXPECT_EQ(o.size(), 5u);
    EXPECT_EQ(o.at("type").as_string(), "urn:idemgate:problem:" + std::string(name));
    EXPECT_EQ(o.at("code").as_string(), name);
    EXPECT_EQ(o.at("status").as_int64(), ProblemDefaultStatus(code));
    EXPECT_EQ(o.at("detail").as_string(), "detail \"quoted\"\n");
    EXPECT_FALSE(o.at("title").as_string().empty());
    EXPECT_EQ(ProblemType(code), "urn:idemgate:problem:" + std::string(name));
  }
}

TEST(ProblemTest, MakeProblemSetsHeadersAndStatusOverride) {
  Response r = MakeProblem(ProblemCode::kTooManyRequests, "slow down", 0, std::chrono::seconds(3));
  EXPECT_EQ(r.status, 429);
  auto find = [&](std::string_view name) -> std::string {
    for (const auto& h : r.headers) {
      if (h.name == name) return h.value;
    }
    return "";
  };
  EXPECT_EQ(find("Content-Type"), "application/problem+json");
  EXPECT_EQ(find("Retry-After"), "3");
  EXPECT_EQ(find("Cache-Control"), "no-store");
  Response shutting = MakeProblem(ProblemCode::kStoreUnavailable, "x", 500);
  EXPECT_EQ(shutting.status, 500);
  EXPECT_NE(shutting.body.find("\"status\":500"), std::string::npos);
  EXPECT_EQ(find("X-None"), "");
}

}  // namespace
}  // namespace idemgate::http
