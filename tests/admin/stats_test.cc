#include "admin/stats.h"

#include <gtest/gtest.h>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <thread>
#include <vector>

namespace idemgate::admin {
namespace {

TEST(RouteStats, ForRouteIsStable) {
  RouteStats stats;
  RouteCounters& a = stats.ForRoute("payments");
  for (int i = 0; i < 100; ++i) stats.ForRoute("r" + std::to_string(i));
  EXPECT_EQ(&a, &stats.ForRoute("payments"));
  EXPECT_NE(&a, &stats.ForRoute("orders"));
}

TEST(RouteStats, CountsExactlyUnderFourThreads) {
  RouteStats stats;
  constexpr int kPerThread = 50'000;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        RouteCounters& c = stats.ForRoute(i % 2 == 0 ? "even" : "odd");
        c.requests.Inc();
        if (t == 0) c.hits.Inc();
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto rows = stats.Snapshot();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].route, "even");
  EXPECT_EQ(rows[0].requests, 4u * kPerThread / 2);
  EXPECT_EQ(rows[0].hits, kPerThread / 2u);
  EXPECT_EQ(rows[1].route, "odd");
  EXPECT_EQ(rows[1].requests, 4u * kPerThread / 2);
  const RouteStatsRow total = RouteStats::Total(rows);
  EXPECT_EQ(total.requests, 4u * kPerThread);
  EXPECT_EQ(total.hits, static_cast<std::uint64_t>(kPerThread));
}

TEST(RouteStats, RendersJsonWithRoutesInOrderAndTotals) {
  RouteStats stats;
  RouteCounters& pay = stats.ForRoute("payments");
  pay.requests.Inc(5);
  pay.hits.Inc(2);
  pay.misses.Inc(1);
  pay.waits.Inc(1);
  pay.conflicts.Inc(1);
  pay.mismatches.Inc(1);
  pay.invalid.Inc(1);
  pay.store_errors.Inc(1);
  pay.stored.Inc(1);
  stats.ForRoute("everything-else").requests.Inc(3);
  const std::string zero_tail =
      R"("waits":0,"conflicts":0,"mismatches":0,"invalid":0,"store_errors":0,"stored":0})";
  const std::string expected =
      R"({"routes":{)"
      R"("everything-else":{"requests":3,"hits":0,"misses":0,)" +
      zero_tail +
      ","
      R"("payments":{"requests":5,"hits":2,"misses":1,"waits":1,"conflicts":1,"mismatches":1,"invalid":1,"store_errors":1,"stored":1}},)"
      R"("totals":{"requests":8,"hits":2,"misses":1,"waits":1,"conflicts":1,"mismatches":1,"invalid":1,"store_errors":1,"stored":1}})";
  EXPECT_EQ(boost::json::serialize(stats.ToJson()), expected);
}

TEST(RouteStats, EmptyRendersEmptyRoutesAndZeroTotals) {
  RouteStats stats;
  EXPECT_EQ(boost::json::serialize(stats.ToJson()),
            R"({"routes":{},"totals":{"requests":0,"hits":0,"misses":0,"waits":0,"conflicts":0,)"
            R"("mismatches":0,"invalid":0,"store_errors":0,"stored":0}})");
}

}  // namespace
}  // namespace idemgate::admin
