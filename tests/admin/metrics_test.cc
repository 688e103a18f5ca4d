#include "admin/metrics.h"
#include "admin/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace idemgate::admin {
namespace {

constexpr int kThreads = 4;
constexpr int kIterations = 100'000;

template <typename F>
void RunThreads(F body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
}

const FamilySnapshot* FindFamily(const std::vector<FamilySnapshot>& families,
                                 std::string_view name) {
  for (const auto& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

TEST(ShardCount, IsAPowerOfTwoWithinBounds) {
  const std::size_t n = ShardCount();
  EXPECT_GE(n, 1u);
  EXPECT_LE(n, 16u);
  EXPECT_EQ(n & (n - 1), 0u);
}

TEST(Counter, CountsExactlyUnderFourThreads) {
  Counter counter;
  RunThreads([&](int) {
    for (int i = 0; i < kIterations; ++i) counter.Inc();
  });
  EXPECT_EQ(counter.Value(), static_cast<std::uint64_t>(kThreads) * kIterations);
  counter.Inc(5);
  EXPECT_EQ(counter.Value(), static_cast<std::uint64_t>(kThreads) * kIterations + 5);
}

TEST(Gauge, AddsAndSubtractsUnderFourThreads) {
  Gauge gauge;
  RunThreads([&](int t) {
    for (int i = 0; i < kIterations; ++i) {
      gauge.Inc();
      if (i % 2 == 0) gauge.Dec();
    }
    gauge.Add(-t);
  });
  // Each thread leaves kIterations/2 increments, minus its index (0+1+2+3).
  EXPECT_EQ(gauge.Value(), kThreads * (kIterations / 2) - 6);
  gauge.Set(-7);
  EXPECT_EQ(gauge.Value(), -7);
  gauge.Set(3);
  EXPECT_EQ(gauge.Value(), 3);
}

TEST(Histogram, BucketsAreUpperInclusive) {
  Histogram h({0.1, 1, 10});
  h.Observe(0.1);                                      // le=0.1
  h.Observe(-5);                                       // below every bound: first bucket
  h.Observe(0.5);                                      // le=1
  h.Observe(1);                                        // le=1
  h.Observe(10.5);                                     // +Inf
  h.Observe(std::numeric_limits<double>::infinity());  // +Inf
  h.Observe(std::nan(""));                             // dropped
  const HistogramData d = h.Snapshot();
  EXPECT_EQ(d.buckets, (std::vector<std::uint64_t>{2, 4, 4, 6}));
  EXPECT_EQ(d.count, 6u);
  EXPECT_TRUE(std::isinf(d.sum));
}

TEST(Histogram, CountsAndSumsExactlyUnderFourThreads) {
  Histogram h(DefaultLatencyBuckets());
  // Dyadic values keep the floating-point sum exact in any order.
  const double values[] = {0.0, 0.25, 1.0, 20.0};
  RunThreads([&](int) {
    for (int i = 0; i < kIterations; ++i) h.Observe(values[i % 4]);
  });
  const HistogramData d = h.Snapshot();
  const std::uint64_t per_value = static_cast<std::uint64_t>(kThreads) * kIterations / 4;
  EXPECT_EQ(d.count, 4 * per_value);
  const auto& bounds = DefaultLatencyBuckets();
  ASSERT_EQ(d.buckets.size(), bounds.size() + 1);
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    std::uint64_t expected = 0;
    if (bounds[i] >= 0.0) expected += per_value;
    if (bounds[i] >= 0.25) expected += per_value;
    if (bounds[i] >= 1.0) expected += per_value;
    EXPECT_EQ(d.buckets[i], expected) << "le=" << bounds[i];
  }
  EXPECT_EQ(d.buckets.back(), 4 * per_value);
  EXPECT_DOUBLE_EQ(d.sum, static_cast<double>(per_value) * (0.25 + 1.0 + 20.0));
}

TEST(DefaultLatencyBuckets, SpanHalfAMillisecondToTenSeconds) {
  const auto& b = DefaultLatencyBuckets();
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.front(), 0.0005);
  EXPECT_EQ(b.back(), 10.0);
  for (std::size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

TEST(Registry, SameLabelsGiveTheSameStableHandle) {
  Registry registry;
  auto& family = registry.AddCounter("hits_total", "Hits.", {"route", "status"});
  Counter& a = family.WithLabelValues({"pay", "200"});
  Counter& b = family.WithLabelValues({"pay", "200"});
  Counter& c = family.WithLabelValues({"pay", "201"});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  // Creating many more series never moves an existing one.
  for (int i = 0; i < 1000; ++i) family.WithLabelValues({"r" + std::to_string(i), "200"}).Inc();
  EXPECT_EQ(&a, &family.WithLabelValues({"pay", "200"}));
  // Lookup by name with label pairs in any order finds the same series.
  EXPECT_EQ(&a, &registry.GetCounter("hits_total", {{"status", "200"}, {"route", "pay"}}));
  EXPECT_EQ(&a, &registry.GetCounter("hits_total", {{"route", "pay"}, {"status", "200"}}));
  EXPECT_EQ(family.size(), 1002u);
}

TEST(Registry, ValuesThatLookAlikeStayDistinct) {
  Registry registry;
  auto& family = registry.AddCounter("pairs_total", "", {"a", "b"});
  // A naive "join with a separator" key would merge these.
  Counter& x = family.WithLabelValues({"ab", "c"});
  Counter& y = family.WithLabelValues({"a", "bc"});
  EXPECT_NE(&x, &y);
}

TEST(Registry, GetCreatesAMissingFamily) {
  Registry registry;
  registry.GetCounter("events_total", {{"kind", "x"}}).Inc(3);
  registry.GetHistogram("latency_seconds", {{"route", "r"}}).Observe(0.2);
  registry.GetGauge("level").Set(9);
  const auto families = registry.Collect();
  const auto* events = FindFamily(families, "events_total");
  ASSERT_NE(events, nullptr);
  EXPECT_EQ(events->label_names, std::vector<std::string>{"kind"});
  ASSERT_EQ(events->samples.size(), 1u);
  EXPECT_EQ(events->samples[0].value, 3);
  const auto* latency = FindFamily(families, "latency_seconds");
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->bounds, DefaultLatencyBuckets());
  const auto* level = FindFamily(families, "level");
  ASSERT_NE(level, nullptr);
  EXPECT_EQ(level->samples.at(0).value, 9);
}

TEST(Registry, MisfitLookupsCountIntoAnUnexportedSink) {
  Registry registry;
  auto& family = registry.AddCounter("x_total", "X.", {"route"});
  family.WithLabelValues({"r"}).Inc();
  // Wrong label name, wrong arity, wrong type, invalid name: none throws,
  // none lands in an exported series.
  registry.GetCounter("x_total", {{"path", "r"}}).Inc(100);
  registry.GetCounter("x_total", {{"route", "r"}, {"extra", "1"}}).Inc(100);
  registry.GetCounter("x_total", {{"route", "r"}, {"route", "r"}}).Inc(100);
  family.WithLabelValues({"r", "too many"}).Inc(100);
  registry.GetGauge("x_total", {{"route", "r"}}).Add(100);
  registry.GetCounter("bad name").Inc(100);
  registry.GetCounter("y_total", {{"__reserved", "v"}}).Inc(100);
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].samples.size(), 1u);
  EXPECT_EQ(families[0].samples[0].value, 1);
}

TEST(Registry, ConflictingDefinitionsThrowAtStartUp) {
  Registry registry;
  auto& a = registry.AddCounter("a_total", "A.", {"route"});
  EXPECT_EQ(&a, &registry.AddCounter("a_total", "A again.", {"route"}));
  EXPECT_THROW(registry.AddCounter("a_total", "A.", {"tenant"}), std::invalid_argument);
  EXPECT_THROW(registry.AddGauge("a_total", "A."), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("1abc", "bad"), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("b_total", "dup", {"x", "x"}), std::invalid_argument);
  EXPECT_THROW(registry.AddCounter("c_total", "bad label", {"a-b"}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("h", "le", {"le"}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("h", "order", {}, {1, 0.5}), std::invalid_argument);
  EXPECT_THROW(registry.AddHistogram("h", "inf", {}, {1, std::numeric_limits<double>::infinity()}),
               std::invalid_argument);
  EXPECT_THROW(registry.SetCallbackGauge("a_total", "clash", [] { return 1.0; }),
               std::invalid_argument);
}

TEST(Registry, AddFillsInTheHelpOfAFamilyCreatedByGet) {
  Registry registry;
  registry.GetCounter("late_total", {{"route", "r"}}).Inc();
  registry.AddCounter("late_total", "Now documented.", {"route"});
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].help, "Now documented.");
  EXPECT_EQ(families[0].samples.at(0).value, 1);
}

TEST(Registry, LabelSetsBeyondTheCapCountIntoOneOverflowSeries) {
  Registry registry(Registry::Options{.max_series_per_family = 3});
  auto& family = registry.AddCounter("t_total", "", {"tenant", "route"});
  for (int i = 0; i < 10; ++i) family.WithLabelValues({"tenant" + std::to_string(i), "r"}).Inc();
  // A real label set spelled like the overflow series joins it, never duplicates it.
  family.WithLabelValues({std::string(kOverflowLabelValue), std::string(kOverflowLabelValue)})
      .Inc();
  EXPECT_EQ(family.size(), 3u);
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  const auto& samples = families[0].samples;
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(samples[0].label_values, (std::vector<std::string>{"_overflow", "_overflow"}));
  EXPECT_EQ(samples[0].value, 8);
  EXPECT_EQ(samples[1].label_values, (std::vector<std::string>{"tenant0", "r"}));
  EXPECT_EQ(samples[3].label_values, (std::vector<std::string>{"tenant2", "r"}));
}

TEST(Registry, ConcurrentFirstUseCreatesEachSeriesOnce) {
  Registry registry;
  registry.AddCounter("c_total", "C.", {"route", "status"});
  RunThreads([&](int) {
    for (int i = 0; i < kIterations; ++i) {
      const std::string route = "r" + std::to_string(i % 50);
      registry.GetCounter("c_total", {{"route", route}, {"status", "200"}}).Inc();
    }
  });
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  ASSERT_EQ(families[0].samples.size(), 50u);
  std::uint64_t total = 0;
  for (const auto& s : families[0].samples) {
    EXPECT_EQ(s.value, kThreads * kIterations / 50) << s.label_values[0];
    total += static_cast<std::uint64_t>(s.value);
  }
  EXPECT_EQ(total, static_cast<std::uint64_t>(kThreads) * kIterations);
}

// Regression: the per-thread lookup cache must never hand out a series of a
// registry that was destroyed, even when a new one reuses its address.
TEST(Registry, CacheNeverOutlivesItsRegistry) {
  for (int round = 0; round < 20; ++round) {
    auto registry = std::make_unique<Registry>();
    Counter& c = registry->GetCounter("reused_total", {{"route", "r"}});
    EXPECT_EQ(c.Value(), 0u) << "round " << round;
    c.Inc();
    auto families = registry->Collect();
    ASSERT_EQ(families.size(), 1u);
    EXPECT_EQ(families[0].samples.at(0).value, 1);
  }
}

TEST(Registry, CallbackGaugesAreReadAtCollect) {
  Registry registry;
  double value = 1.5;
  registry.SetCallbackGauge("cb_value", "From a callback.", [&] { return value; });
  EXPECT_EQ(registry.Collect().at(0).samples.at(0).value, 1.5);
  value = 4;
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].type, MetricType::kGauge);
  EXPECT_EQ(families[0].help, "From a callback.");
  EXPECT_EQ(families[0].samples.at(0).value, 4);
  registry.SetCallbackGauge("cb_value", "", nullptr);
  EXPECT_TRUE(registry.Collect().empty());
}

// A count kept elsewhere (the memory store's dropped bodies) is exported
// typed as a counter, so rate() works on it.
TEST(Registry, CallbackCountersAreTypedCounters) {
  Registry registry;
  double value = 3;
  registry.SetCallbackCounter("cb_things_total", "Things.", [&] { return value; });
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].type, MetricType::kCounter);
  EXPECT_EQ(families[0].samples.at(0).value, 3);
  EXPECT_NE(FormatPrometheus(families).find("# TYPE cb_things_total counter"), std::string::npos);
  registry.SetCallbackCounter("cb_things_total", "", nullptr);
  EXPECT_TRUE(registry.Collect().empty());
}

TEST(Registry, CollectSortsFamiliesAndSeries) {
  Registry registry;
  auto& z = registry.AddCounter("z_total", "", {"k"});
  registry.AddGauge("a_gauge", "");
  z.WithLabelValues({"b"}).Inc();
  z.WithLabelValues({"a"}).Inc();
  z.WithLabelValues({"c"}).Inc();
  const auto families = registry.Collect();
  ASSERT_EQ(families.size(), 2u);
  EXPECT_EQ(families[0].name, "a_gauge");
  EXPECT_TRUE(families[0].samples.empty());
  EXPECT_EQ(families[1].name, "z_total");
  ASSERT_EQ(families[1].samples.size(), 3u);
  EXPECT_EQ(families[1].samples[0].label_values[0], "a");
  EXPECT_EQ(families[1].samples[1].label_values[0], "b");
  EXPECT_EQ(families[1].samples[2].label_values[0], "c");
}

}  // namespace
}  // namespace idemgate::admin
