#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "admin/snapshot.h"

// A registry of counters, gauges and histograms with label sets, built for
// the request path on many I/O threads at once.
//
// - Handles are stable: a Counter& (Gauge&, Histogram&) obtained once stays
//   valid, and keeps counting, for the life of its Registry. Series are never
//   removed.
// - Updates are relaxed atomic adds on a per-thread shard: every metric keeps
//   ShardCount() cells, each on its own cache line, and a thread always writes
//   the cell of its shard, so two I/O threads never contend on one line.
//   Reads (scrapes) sum the cells; a scrape concurrent with updates sees each
//   cell either before or after an update, never a torn value.
// - Finding a series by label values, for callers that cannot keep the
//   handle, goes through a per-thread cache first (no shared writes at all),
//   then a hash map under a reader lock, and takes the writer lock only the
//   first time a label set is seen.
// - A family holds at most Options::max_series_per_family label sets; label
//   sets beyond it all count into one series whose every label value is
//   kOverflowLabelValue, so a flood of distinct tenants cannot exhaust memory.
namespace idemgate::admin {

inline constexpr std::size_t kCacheLine = 64;
// Label value of the series that absorbs label sets beyond the family's cap.
inline constexpr std::string_view kOverflowLabelValue = "_overflow";

// Cells per sharded metric: the number of hardware threads rounded up to a
// power of two, at most 16. Fixed for the life of the process.
std::size_t ShardCount();

namespace detail {
inline thread_local std::uint32_t tls_shard = UINT32_MAX;
std::uint32_t AssignShard() noexcept;
// The calling thread's shard in [0, ShardCount()); fixed per thread.
inline std::size_t ThisShard() noexcept {
  std::uint32_t shard = tls_shard;
  if (shard == UINT32_MAX) [[unlikely]] {
    shard = tls_shard = AssignShard();
  }
  return shard;
}

// A process-wide unique id, never reused: identifies an owner of entries in
// the per-thread lookup cache below.
std::uint64_t NextUid() noexcept;
// The calling thread's scratch key, cleared and prefixed with `uid`; append
// the rest of the lookup key to it. Valid until the next call on this thread.
std::string& LookupKey(std::uint64_t uid);
// The calling thread's lookup cache: stable pointers by uid-prefixed key.
// Entries are never invalidated, so only cache pointers to objects that live
// as long as their uid's owner; the cache is bounded and may forget entries.
void* CachedLookup(std::string_view key);
void CacheLookup(std::string_view key, void* value);
}  // namespace detail

class Metric {
 public:
  virtual ~Metric() = default;
};

// Monotonic counter. Inc is wait-free; thread-safe.
class Counter final : public Metric {
 public:
  Counter();
  void Inc(std::uint64_t n = 1) noexcept {
    cells_[detail::ThisShard()].value.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t Value() const noexcept;

 private:
  struct alignas(kCacheLine) Cell {
    std::atomic<std::uint64_t> value{0};
  };
  std::unique_ptr<Cell[]> cells_;
};

// Value that goes up and down (e.g. requests in flight). Add/Inc/Dec are
// wait-free and thread-safe. Set is meant for a gauge with one writer: it is
// not atomic with respect to concurrent Adds.
class Gauge final : public Metric {
 public:
  Gauge();
  void Add(std::int64_t delta) noexcept {
    cells_[detail::ThisShard()].value.fetch_add(delta, std::memory_order_relaxed);
  }
  void Inc() noexcept { Add(1); }
  void Dec() noexcept { Add(-1); }
  void Set(std::int64_t value) noexcept { Add(value - Value()); }
  std::int64_t Value() const noexcept;

 private:
  struct alignas(kCacheLine) Cell {
    std::atomic<std::int64_t> value{0};
  };
  std::unique_ptr<Cell[]> cells_;
};

// Fixed-bucket histogram. Observe is lock-free and thread-safe; NaN
// observations are dropped. A value v falls in the first bucket whose upper
// bound b satisfies v <= b, else in +Inf.
class Histogram final : public Metric {
 public:
  // `bounds`: strictly ascending finite upper bounds (checked by Registry).
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value) noexcept;
  HistogramData Snapshot() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  static constexpr std::size_t kCellsPerLine = kCacheLine / sizeof(std::uint64_t);
  struct alignas(kCacheLine) Line {
    std::atomic<std::uint64_t> cells[kCellsPerLine];
  };
  // Per shard: cell 0 holds the bits of the sum (a double), cells
  // 1..bounds+1 the non-cumulative bucket counts (+Inf last).
  std::atomic<std::uint64_t>& Cell(std::size_t shard, std::size_t index) const {
    return lines_[shard * lines_per_shard_ + index / kCellsPerLine].cells[index % kCellsPerLine];
  }

  std::vector<double> bounds_;
  std::size_t lines_per_shard_;
  std::unique_ptr<Line[]> lines_;
};

// Latency buckets in seconds, 0.5 ms .. 10 s, used for
// idemgate_request_duration_seconds and idemgate_upstream_duration_seconds.
const std::vector<double>& DefaultLatencyBuckets();

using LabelPair = std::pair<std::string_view, std::string_view>;

// The series of one metric name, one per label value tuple. Owned by a
// Registry; thread-safe.
class FamilyBase {
 public:
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;
  virtual ~FamilyBase();

  const std::string& name() const { return name_; }
  std::string help() const;
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Distinct label sets seen so far (the overflow series not counted).
  std::size_t size() const;

  FamilySnapshot Collect() const;

 protected:
  FamilyBase(MetricType type, std::string name, std::string help,
             std::vector<std::string> label_names, std::vector<double> bounds,
             std::size_t max_series);
  // The series for `values` (in label_names() order), created on first use.
  // A wrong number of values yields an unexported sink series.
  Metric& Find(std::span<const std::string_view> values);

 private:
  friend class Registry;
  struct Series {
    std::vector<std::string> label_values;
    std::unique_ptr<Metric> metric;
  };
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unique_ptr<Metric> NewMetric() const;

  const std::uint64_t uid_;
  const MetricType type_;
  const std::string name_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;
  const std::size_t max_series_;
  const std::unique_ptr<Metric> sink_;

  mutable std::shared_mutex mu_;
  std::string help_;  // a family created by Get*() gets its help from a later Add*()
  std::unordered_map<std::string, Series, KeyHash, std::equal_to<>> series_;
  std::unique_ptr<Metric> overflow_;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  // `values` in label_names() order. Never throws on a bad arity: it returns
  // an unexported series instead.
  T& WithLabelValues(std::initializer_list<std::string_view> values) {
    return static_cast<T&>(Find(std::span<const std::string_view>(values.begin(), values.size())));
  }
  T& WithLabelValues(std::span<const std::string_view> values) {
    return static_cast<T&>(Find(values));
  }

 private:
  friend class Registry;
  Family(MetricType type, std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds, std::size_t max_series)
      : FamilyBase(type, std::move(name), std::move(help), std::move(label_names),
                   std::move(bounds), max_series) {}
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

// Owns metric families. Thread-safe. Registration (Add*) is a start-up API
// that throws std::invalid_argument on an invalid or conflicting definition;
// everything else never throws.
class Registry {
 public:
  struct Options {
    std::size_t max_series_per_family = 10'000;
  };

  Registry();
  explicit Registry(Options options);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Defines a family; returns the existing one when the same name was
  // defined before with the same type, labels (and bounds). Names follow
  // Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*, labels [a-zA-Z_][a-zA-Z0-9_]*,
  // no label starting with "__", no "le" on a histogram).
  CounterFamily& AddCounter(std::string_view name, std::string_view help,
                            std::vector<std::string> label_names = {});
  GaugeFamily& AddGauge(std::string_view name, std::string_view help,
                        std::vector<std::string> label_names = {});
  HistogramFamily& AddHistogram(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names = {},
                                std::vector<double> bounds = DefaultLatencyBuckets());
  // An unlabelled gauge whose value `read` returns at each Collect (called
  // without registry locks held, on the collecting thread). Replaces an
  // earlier callback of the same name; a null `read` removes it. `read` must
  // stay callable until it is replaced or the Registry is destroyed.
  void SetCallbackGauge(std::string_view name, std::string_view help, std::function<double()> read);
  // The same for a counter kept elsewhere (`read` must never go down).
  void SetCallbackCounter(std::string_view name, std::string_view help, std::function<double()> read);

  // The series of `name` with `labels` (any order), for callers that cannot
  // keep the handle. A family not defined yet is created with these label
  // names (in this order) and no help text. A name or label set that does not
  // fit the existing family (other type, other label names) or is invalid
  // yields an unexported sink metric that still counts.
  Counter& GetCounter(std::string_view name, std::initializer_list<LabelPair> labels = {});
  Counter& GetCounter(std::string_view name, std::span<const LabelPair> labels);
  Gauge& GetGauge(std::string_view name, std::initializer_list<LabelPair> labels = {});
  Gauge& GetGauge(std::string_view name, std::span<const LabelPair> labels);
  // A histogram created here uses DefaultLatencyBuckets().
  Histogram& GetHistogram(std::string_view name, std::initializer_list<LabelPair> labels = {});
  Histogram& GetHistogram(std::string_view name, std::span<const LabelPair> labels);

  // Every family (and callback gauge) with its series, sorted by name, series
  // sorted by label values. Families without series are included.
  std::vector<FamilySnapshot> Collect() const;

 private:
  struct Callback {  // a gauge or counter read at each collection
    MetricType type = MetricType::kGauge;
    std::string help;
    std::shared_ptr<std::function<double()>> read;
  };
  FamilyBase& Define(MetricType type, std::string_view name, std::string_view help,
                     std::vector<std::string> label_names, std::vector<double> bounds);
  // Adds a validated family that does not exist yet; mu_ held exclusively.
  FamilyBase& CreateLocked(MetricType type, std::string_view name, std::string_view help,
                           std::vector<std::string> label_names, std::vector<double> bounds);
  Metric& Get(MetricType type, std::string_view name, std::span<const LabelPair> labels);
  FamilyBase* FindFamily(std::string_view name);
  void SetCallback(MetricType type, std::string_view name, std::string_view help, std::function<double()> read);

  const std::uint64_t uid_;
  const Options options_;
  const std::unique_ptr<Counter> counter_sink_;
  const std::unique_ptr<Gauge> gauge_sink_;
  const std::unique_ptr<Histogram> histogram_sink_;

  mutable std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>, std::less<>> families_;
  std::map<std::string, Callback, std::less<>> callbacks_;
};

}  // namespace idemgate::admin
