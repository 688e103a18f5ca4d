#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Point-in-time copies of metric values: what Registry::Collect() produces
// and what the Prometheus formatter consumes. Plain data, no behaviour.
namespace idemgate::admin {

enum class MetricType { kCounter, kGauge, kHistogram };

struct HistogramData {
  // Cumulative counts, one per bucket bound and a last one for +Inf, so
  // buckets.back() == count.
  std::vector<std::uint64_t> buckets;
  double sum = 0;
  std::uint64_t count = 0;
};

struct Sample {
  std::vector<std::string> label_values;  // parallel to FamilySnapshot::label_names
  double value = 0;                       // counters and gauges
  HistogramData histogram;                // histograms
};

struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<std::string> label_names;
  std::vector<double> bounds;  // histograms: upper bounds, ascending, +Inf implied
  std::vector<Sample> samples;
};

}  // namespace idemgate::admin
