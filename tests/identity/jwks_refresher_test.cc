// JwksRefresher (gateway/jwks_refresher.h) with a fake fetch: no network, short
// intervals through JwksRefresherOptions.
#include "gateway/jwks_refresher.h"

#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fakes/testing.h"

namespace idemgate::gateway {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

using idemgate::testing::Base64UrlEncode;

// A JWKS with one new P-256 key named `kid`.
std::string JwksWithKid(const std::string& kid) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"), EVP_PKEY_free);
  EXPECT_NE(key, nullptr);
  auto coordinate = [&](const char* name) {
    BIGNUM* raw = nullptr;
    EXPECT_EQ(EVP_PKEY_get_bn_param(key.get(), name, &raw), 1) << name;
    std::unique_ptr<BIGNUM, decltype(&BN_free)> bn(raw, BN_free);
    std::string bytes(32, '\0');
    BN_bn2binpad(bn.get(), reinterpret_cast<unsigned char*>(bytes.data()), 32);
    return Base64UrlEncode(bytes);
  };
  return R"({"keys":[{"kty":"EC","crv":"P-256","kid":")" + kid + R"(","x":")" +
         coordinate(OSSL_PKEY_PARAM_EC_PUB_X) + R"(","y":")" + coordinate(OSSL_PKEY_PARAM_EC_PUB_Y) + R"("}]})";
}

// What the fake identity provider serves; thread-safe. Counts the fetches.
class FakeIdp {
 public:
  explicit FakeIdp(std::string document) : document_(std::move(document)) {}

  // What every URL serves (and no error any more).
  void Serve(std::string document) {
    std::lock_guard lock(mu_);
    document_ = std::move(document);
    error_.clear();
  }
  // What `url` serves instead.
  void ServeAt(const std::string& url, std::string document) {
    std::lock_guard lock(mu_);
    by_url_[url] = std::move(document);
  }
  void Fail(std::string error) {
    std::lock_guard lock(mu_);
    error_ = std::move(error);
  }
  // Fetches of `url` ("": of every URL) block until Release(url).
  void Hold(const std::string& url = "") {
    std::lock_guard lock(mu_);
    held_.insert(url);
  }
  void Release(const std::string& url = "") {
    {
      std::lock_guard lock(mu_);
      held_.erase(url);
    }
    cv_.notify_all();
  }

  int fetches() const { return fetches_.load(); }
  int finished() const { return finished_.load(); }
  int waiting() const { return waiting_.load(); }
  std::vector<std::string> urls() const {
    std::lock_guard lock(mu_);
    return urls_;
  }

  JwksFetch Fetch() {
    return [this](const JwksSource& source) -> StatusOr<std::string> {
      ++fetches_;
      std::unique_lock lock(mu_);
      urls_.push_back(source.url);
      ++waiting_;
      cv_.wait(lock, [&] { return held_.count("") == 0 && held_.count(source.url) == 0; });
      --waiting_;
      const auto it = by_url_.find(source.url);
      StatusOr<std::string> result = !error_.empty()        ? StatusOr<std::string>(UnavailableError(error_))
                                     : it != by_url_.end() ? StatusOr<std::string>(it->second)
                                                            : StatusOr<std::string>(document_);
      lock.unlock();
      ++finished_;
      return result;
    };
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string document_;
  std::map<std::string, std::string> by_url_;
  std::string error_;
  std::set<std::string> held_;
  std::vector<std::string> urls_;
  std::atomic<int> fetches_{0};
  std::atomic<int> finished_{0};
  std::atomic<int> waiting_{0};
};

config::JwtIdentity Settings(std::string url, Duration refresh = std::chrono::minutes(5)) {
  config::JwtIdentity jwt;
  jwt.jwks_url = std::move(url);
  jwt.jwks_refresh = refresh;
  return jwt;
}

// The kids of the refresher's keys, in order; {"<null>"} without keys.
std::vector<std::string> Kids(const JwksRefresher& refresher) {
  const auto keys = refresher.Keys();
  if (keys == nullptr) return {"<null>"};
  std::vector<std::string> kids;
  for (const identity::JwtKey& key : *keys) kids.push_back(key.kid);
  return kids;
}

bool PollUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = Steady::now() + timeout;
  while (!done()) {
    if (Steady::now() >= deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

const std::vector<std::string> kA = {"a"};
const std::vector<std::string> kB = {"b"};
const std::vector<std::string> kNoKeys = {"<null>"};

TEST(JwksRefresherTest, AFailedFirstFetchIsAConfigureErrorAndChangesNothing) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()});
  idp.Fail("connection refused");
  Status status = refresher.Configure(Settings("http://idp.test/jwks"));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "identity.jwt.jwks_url: http://idp.test/jwks: connection refused");
  EXPECT_EQ(Kids(refresher), kNoKeys);

  // A document without a usable key fails the same way.
  idp.Serve(R"({"keys":[{"kty":"oct","k":"c2VjcmV0"}]})");
  status = refresher.Configure(Settings("http://idp.test/jwks"));
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "identity.jwt.jwks_url: http://idp.test/jwks: JWKS holds no usable signature key");
  idp.Serve("not json");
  EXPECT_NE(refresher.Configure(Settings("http://idp.test/jwks")).message().find("JWKS is not JSON"),
            std::string::npos);
  EXPECT_EQ(Kids(refresher), kNoKeys);

  // Once running, a failed Configure for other settings keeps the running ones and their keys.
  idp.Serve(JwksWithKid("a"));
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks")).ok());
  idp.Fail("timed out");
  status = refresher.Configure(Settings("http://other.test/jwks"));
  EXPECT_EQ(status.message(), "identity.jwt.jwks_url: http://other.test/jwks: timed out");
  EXPECT_EQ(Kids(refresher), kA);
  // ... and the same settings again are still the running ones: no fetch.
  const int fetches = idp.fetches();
  EXPECT_TRUE(refresher.Configure(Settings("http://idp.test/jwks")).ok());
  EXPECT_EQ(idp.fetches(), fetches);
}

TEST(JwksRefresherTest, SettingsOutOfRangeAreRefusedWithoutAFetch) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()});
  Status status = refresher.Configure(Settings("http://idp.test/jwks", 9s));
  EXPECT_EQ(status.message(), "identity.jwt.jwks_refresh: must be at least 10s");
  config::JwtIdentity no_timeout = Settings("http://idp.test/jwks");
  no_timeout.jwks_timeout = Duration(0);
  EXPECT_EQ(refresher.Configure(no_timeout).message(), "identity.jwt.jwks_timeout: must be greater than 0");
  EXPECT_EQ(idp.fetches(), 0);
}

TEST(JwksRefresherTest, ConfigurePublishesTheKeysAndAnEmptyUrlDropsThem) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()});
  EXPECT_EQ(Kids(refresher), kNoKeys);
  // No URL: nothing to do.
  ASSERT_TRUE(refresher.Configure(config::JwtIdentity{}).ok());
  EXPECT_EQ(idp.fetches(), 0);

  config::JwtIdentity jwt = Settings("https://idp.test/.well-known/jwks.json");
  ASSERT_TRUE(refresher.Configure(jwt).ok());
  EXPECT_EQ(Kids(refresher), kA);
  EXPECT_EQ(idp.fetches(), 1);
  EXPECT_EQ(refresher.fetch_count(), 1u);
  EXPECT_EQ(idp.urls(), (std::vector<std::string>{"https://idp.test/.well-known/jwks.json"}));
  // The same settings: nothing happens. Settings that do not concern the JWKS do not count.
  jwt.issuer = "https://idp.test";
  ASSERT_TRUE(refresher.Configure(jwt).ok());
  EXPECT_EQ(idp.fetches(), 1);
  // Another CA file, timeout or refresh interval: fetched again.
  idp.Serve(JwksWithKid("b"));
  jwt.jwks_timeout = 2s;
  ASSERT_TRUE(refresher.Configure(jwt).ok());
  EXPECT_EQ(idp.fetches(), 2);
  EXPECT_EQ(Kids(refresher), kB);
  jwt.jwks_ca_file = "/etc/idp-ca.pem";
  ASSERT_TRUE(refresher.Configure(jwt).ok());
  EXPECT_EQ(idp.fetches(), 3);

  // Keys() hands out a snapshot that outlives a change.
  const auto held = refresher.Keys();
  ASSERT_TRUE(refresher.Configure(config::JwtIdentity{}).ok());
  EXPECT_EQ(Kids(refresher), kNoKeys);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->at(0).kid, "b");
  // Without a URL a request for a refresh does nothing.
  refresher.RequestRefresh();
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(idp.fetches(), 3);
}

TEST(JwksRefresherTest, ThePeriodicRefreshSwapsTheKeys) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch(), .min_refresh = 1ms});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", 20ms)).ok());
  EXPECT_EQ(Kids(refresher), kA);
  idp.Serve(JwksWithKid("b"));
  EXPECT_TRUE(PollUntil([&] { return Kids(refresher) == kB; })) << "fetches: " << idp.fetches();
  // And it keeps going.
  const int fetches = idp.fetches();
  EXPECT_TRUE(PollUntil([&] { return idp.fetches() >= fetches + 3; }));
}

TEST(JwksRefresherTest, AFailedRefreshKeepsTheLastGoodKeys) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch(), .min_refresh = 1ms});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", 20ms)).ok());
  idp.Fail("503 Service Unavailable");
  int fetches = idp.fetches();
  ASSERT_TRUE(PollUntil([&] { return idp.finished() >= fetches + 2; }));
  EXPECT_EQ(Kids(refresher), kA);
  // A document without a usable key is a failure too.
  idp.Serve(R"({"keys":[]})");
  fetches = idp.fetches();
  ASSERT_TRUE(PollUntil([&] { return idp.finished() >= fetches + 2; }));
  EXPECT_EQ(Kids(refresher), kA);
  // Once the provider is back, so are fresh keys.
  idp.Serve(JwksWithKid("b"));
  EXPECT_TRUE(PollUntil([&] { return Kids(refresher) == kB; }));
}

TEST(JwksRefresherTest, RequestRefreshFetchesAtOnceButOncePerInterval) {
  FakeIdp idp(JwksWithKid("a"));
  // No periodic refresh within the test; on demand at most once an hour.
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch(), .on_demand_interval = std::chrono::hours(1)});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", std::chrono::hours(1))).ok());
  ASSERT_EQ(idp.fetches(), 1);
  idp.Serve(JwksWithKid("b"));
  // The first request is served right away (the start-up fetch does not count against it).
  refresher.RequestRefresh();
  ASSERT_TRUE(PollUntil([&] { return Kids(refresher) == kB; }));
  EXPECT_EQ(idp.fetches(), 2);
  // Later ones within the interval are dropped, however many.
  for (int i = 0; i < 100; ++i) refresher.RequestRefresh();
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(idp.fetches(), 2);
}

TEST(JwksRefresherTest, RequestRefreshIsAllowedAgainAfterTheInterval) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch(), .on_demand_interval = 300ms});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", std::chrono::hours(1))).ok());
  refresher.RequestRefresh();
  ASSERT_TRUE(PollUntil([&] { return idp.finished() == 2; }));
  std::this_thread::sleep_for(350ms);
  refresher.RequestRefresh();
  EXPECT_TRUE(PollUntil([&] { return idp.finished() == 3; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(idp.fetches(), 3);
}

TEST(JwksRefresherTest, RequestRefreshNeverWaitsForTheFetch) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch(), .on_demand_interval = 1ms});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", std::chrono::hours(1))).ok());
  idp.Hold();
  refresher.RequestRefresh();
  ASSERT_TRUE(PollUntil([&] { return idp.waiting() == 1; }));
  // The fetch hangs; the callers of Keys() and RequestRefresh() do not.
  const Steady::time_point start = Steady::now();
  for (int i = 0; i < 10; ++i) {
    refresher.RequestRefresh();
    EXPECT_EQ(Kids(refresher), kA);
  }
  EXPECT_LT(Steady::now() - start, 1s);
  idp.Release();
}

TEST(JwksRefresherTest, AFetchForReplacedSettingsIsDropped) {
  FakeIdp idp(JwksWithKid("a"));
  idp.ServeAt("http://new.test/jwks", JwksWithKid("b"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()});
  ASSERT_TRUE(refresher.Configure(Settings("http://old.test/jwks", std::chrono::hours(1))).ok());
  // A refresh of the old URL is under way (it will bring key "a" again)...
  idp.Hold("http://old.test/jwks");
  refresher.RequestRefresh();
  ASSERT_TRUE(PollUntil([&] { return idp.waiting() == 1; }));
  // ... when the settings change to the new URL (key "b").
  ASSERT_TRUE(refresher.Configure(Settings("http://new.test/jwks", std::chrono::hours(1))).ok());
  EXPECT_EQ(Kids(refresher), kB);
  // The old fetch ends after that: its keys are dropped.
  idp.Release("http://old.test/jwks");
  ASSERT_TRUE(PollUntil([&] { return idp.finished() == 3; }));
  std::this_thread::sleep_for(50ms);  // lets the old fetch's result reach the refresher
  EXPECT_EQ(Kids(refresher), kB);
  EXPECT_EQ(idp.urls(), (std::vector<std::string>{"http://old.test/jwks", "http://old.test/jwks", "http://new.test/jwks"}));
}

TEST(JwksRefresherTest, RevertRestoresTheSettingsAndKeysTheLastConfigureReplaced) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()});
  refresher.Revert();  // nothing to revert
  EXPECT_EQ(Kids(refresher), kNoKeys);
  ASSERT_TRUE(refresher.Configure(Settings("http://one.test/jwks")).ok());
  idp.Serve(JwksWithKid("b"));
  ASSERT_TRUE(refresher.Configure(Settings("http://two.test/jwks")).ok());
  EXPECT_EQ(Kids(refresher), kB);
  refresher.Revert();
  EXPECT_EQ(Kids(refresher), kA);
  EXPECT_EQ(idp.fetches(), 2);  // without a fetch
  // One.test is running again: configuring it changes nothing, and a Revert after that neither.
  ASSERT_TRUE(refresher.Configure(Settings("http://one.test/jwks")).ok());
  refresher.Revert();
  EXPECT_EQ(Kids(refresher), kA);
  EXPECT_EQ(idp.fetches(), 2);
  // Revert after dropping the URL brings it back; a second Revert does nothing more.
  ASSERT_TRUE(refresher.Configure(config::JwtIdentity{}).ok());
  EXPECT_EQ(Kids(refresher), kNoKeys);
  refresher.Revert();
  EXPECT_EQ(Kids(refresher), kA);
  refresher.Revert();
  EXPECT_EQ(Kids(refresher), kA);
  // A failed Configure leaves nothing to revert either.
  idp.Fail("refused");
  EXPECT_FALSE(refresher.Configure(Settings("http://three.test/jwks")).ok());
  refresher.Revert();
  EXPECT_EQ(Kids(refresher), kA);
}

TEST(JwksRefresherTest, TheDestructorReturnsPromptly) {
  FakeIdp idp(JwksWithKid("a"));
  {
    // Idle: waiting for an hour-long refresh.
    auto refresher = std::make_unique<JwksRefresher>(JwksRefresherOptions{.fetch = idp.Fetch()});
    ASSERT_TRUE(refresher->Configure(Settings("http://idp.test/jwks", std::chrono::hours(1))).ok());
    const Steady::time_point start = Steady::now();
    refresher.reset();
    EXPECT_LT(Steady::now() - start, 1s);
  }
  {
    // In the middle of a fetch: the destructor waits for that fetch (bounded by jwks_timeout in real
    // fetches) and no longer.
    auto refresher = std::make_unique<JwksRefresher>(JwksRefresherOptions{.fetch = idp.Fetch()});
    ASSERT_TRUE(refresher->Configure(Settings("http://idp.test/jwks", std::chrono::hours(1))).ok());
    idp.Hold();
    refresher->RequestRefresh();
    ASSERT_TRUE(PollUntil([&] { return idp.waiting() == 1; }));
    std::thread release([&] {
      std::this_thread::sleep_for(100ms);
      idp.Release();
    });
    const Steady::time_point start = Steady::now();
    refresher.reset();
    EXPECT_LT(Steady::now() - start, 2s);
    release.join();
  }
  {
    // Never configured: no thread at all.
    const Steady::time_point start = Steady::now();
    { JwksRefresher refresher(JwksRefresherOptions{.fetch = idp.Fetch()}); }
    EXPECT_LT(Steady::now() - start, 1s);
  }
}

TEST(JwksRefresherTest, KeysAndRequestsFromManyThreadsWhileRefreshing) {
  FakeIdp idp(JwksWithKid("a"));
  JwksRefresher refresher(
      JwksRefresherOptions{.fetch = idp.Fetch(), .min_refresh = 1ms, .on_demand_interval = 1ms});
  ASSERT_TRUE(refresher.Configure(Settings("http://idp.test/jwks", 1ms)).ok());
  const std::vector<std::string> documents = {JwksWithKid("a"), JwksWithKid("b")};
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        const auto keys = refresher.Keys();
        if (keys == nullptr || keys->size() != 1 || (keys->at(0).kid != "a" && keys->at(0).kid != "b")) ++bad;
        refresher.RequestRefresh();
      }
    });
  }
  for (int i = 0; i < 40; ++i) {
    idp.Serve(documents[static_cast<std::size_t>(i % 2)]);
    std::this_thread::sleep_for(5ms);
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(idp.fetches(), 2);
}

}  // namespace
}  // namespace idemgate::gateway
