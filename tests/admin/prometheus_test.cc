#include "admin/prometheus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <span>

#include "admin/metrics.h"

namespace idemgate::admin {
namespace {

TEST(FormatPrometheus, SmallRegistryGolden) {
  Registry registry;
  auto& hits = registry.AddCounter("demo_hits_total", "Replays served.", {"route", "status"});
  hits.WithLabelValues({"payments", "201"}).Inc(3);
  hits.WithLabelValues({"orders", "200"}).Inc();
  registry.AddGauge("demo_in_flight", "Requests in flight.")
      .WithLabelValues(std::span<const std::string_view>{})
      .Set(2);
  auto& latency =
      registry.AddHistogram("demo_latency_seconds", "Latency.", {"route"}, {0.005, 0.1, 1});
  Histogram& h = latency.WithLabelValues({"payments"});
  // Binary fractions, so the sum is exact.
  h.Observe(0.00390625);
  h.Observe(0.0625);
  h.Observe(0.0625);
  h.Observe(2.5);
  registry.SetCallbackGauge("demo_store_keys", "", [] { return 42.0; });
  registry.AddCounter("demo_unused_total", "Never incremented.", {"route"});

  const std::string expected =
      "# HELP demo_hits_total Replays served.\n"
      "# TYPE demo_hits_total counter\n"
      "demo_hits_total{route=\"orders\",status=\"200\"} 1\n"
      "demo_hits_total{route=\"payments\",status=\"201\"} 3\n"
      "# HELP demo_in_flight Requests in flight.\n"
      "# TYPE demo_in_flight gauge\n"
      "demo_in_flight 2\n"
      "# HELP demo_latency_seconds Latency.\n"
      "# TYPE demo_latency_seconds histogram\n"
      "demo_latency_seconds_bucket{route=\"payments\",le=\"0.005\"} 1\n"
      "demo_latency_seconds_bucket{route=\"payments\",le=\"0.1\"} 3\n"
      "demo_latency_seconds_bucket{route=\"payments\",le=\"1\"} 3\n"
      "demo_latency_seconds_bucket{route=\"payments\",le=\"+Inf\"} 4\n"
      "demo_latency_seconds_sum{route=\"payments\"} 2.62890625\n"
      "demo_latency_seconds_count{route=\"payments\"} 4\n"
      "# TYPE demo_store_keys gauge\n"
      "demo_store_keys 42\n"
      "# HELP demo_unused_total Never incremented.\n"
      "# TYPE demo_unused_total counter\n";
  EXPECT_EQ(FormatPrometheus(registry.Collect()), expected);
}

TEST(FormatPrometheus, UnlabelledHistogramHasOnlyLe) {
  FamilySnapshot f;
  f.name = "h_seconds";
  f.type = MetricType::kHistogram;
  f.bounds = {0.5};
  Sample s;
  s.histogram.buckets = {1, 2};
  s.histogram.count = 2;
  s.histogram.sum = 1.25;
  f.samples.push_back(s);
  EXPECT_EQ(FormatPrometheus({f}),
            "# TYPE h_seconds histogram\n"
            "h_seconds_bucket{le=\"0.5\"} 1\n"
            "h_seconds_bucket{le=\"+Inf\"} 2\n"
            "h_seconds_sum 1.25\n"
            "h_seconds_count 2\n");
}

TEST(FormatPrometheus, EscapesLabelValuesAndHelp) {
  FamilySnapshot f;
  f.name = "esc_total";
  f.help = "Line one\nback\\slash \"quotes\" stay";
  f.type = MetricType::kCounter;
  f.label_names = {"v"};
  Sample s;
  s.label_values = {"a\\b\"c\nd"};
  s.value = 1;
  f.samples.push_back(s);
  EXPECT_EQ(FormatPrometheus({f}),
            "# HELP esc_total Line one\\nback\\\\slash \"quotes\" stay\n"
            "# TYPE esc_total counter\n"
            "esc_total{v=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(FormatPrometheus, OrderDoesNotDependOnInputOrder) {
  std::vector<FamilySnapshot> families(3);
  const char* names[] = {"b_total", "a_total", "c_total"};
  for (int i = 0; i < 3; ++i) {
    families[i].name = names[i];
    families[i].label_names = {"k"};
    for (const char* v : {"y", "x", "z"}) {
      Sample s;
      s.label_values = {v};
      s.value = i;
      families[i].samples.push_back(s);
    }
  }
  const std::string first = FormatPrometheus(families);
  std::reverse(families.begin(), families.end());
  for (auto& f : families) std::reverse(f.samples.begin(), f.samples.end());
  EXPECT_EQ(FormatPrometheus(families), first);
  EXPECT_LT(first.find("a_total{k=\"x\"}"), first.find("a_total{k=\"y\"}"));
  EXPECT_LT(first.find("a_total{k=\"z\"}"), first.find("# TYPE b_total"));
}

TEST(FormatValue, SpellsNumbersTheWayPrometheusReadsThem) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(0.0005), "0.0005");
  EXPECT_EQ(FormatValue(2.5), "2.5");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e-7), "1e-07");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(ContentType, IsTextFormatZeroZeroFour) {
  EXPECT_EQ(kPrometheusContentType, "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace
}  // namespace idemgate::admin
