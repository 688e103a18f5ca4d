#include "admin/metrics.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace idemgate::admin {
namespace {

constexpr std::size_t kMaxShards = 16;
constexpr std::size_t kMaxLabels = 16;
// Entries a thread's lookup cache holds before it is emptied; bounds the
// memory of threads that touch many label sets (and entries of destroyed
// registries, which can never match again because uids are not reused).
constexpr std::size_t kMaxCachedEntries = 4096;

// Unique per family and per registry, never reused, so a cache entry of a
// destroyed object can never be mistaken for a live one.
std::atomic<std::uint64_t> g_next_uid{1};
std::atomic<std::uint32_t> g_next_thread{0};

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

// Per-thread lookup cache: uid-prefixed key -> FamilyBase* or Metric*.
struct ThreadCache {
  std::string scratch;
  std::unordered_map<std::string, void*, StringHash, std::equal_to<>> entries;

  void* Find(std::string_view key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : it->second;
  }
  void Insert(std::string_view key, void* value) {
    if (entries.size() >= kMaxCachedEntries) entries.clear();
    entries.emplace(std::string(key), value);
  }
};

ThreadCache& Tls() {
  thread_local ThreadCache cache;
  return cache;
}

void AppendUid(std::string& key, std::uint64_t uid) {
  char bytes[sizeof uid];
  std::memcpy(bytes, &uid, sizeof uid);
  key.append(bytes, sizeof uid);
}

// Length-prefixed, so distinct value tuples always give distinct keys.
void AppendPart(std::string& key, std::string_view part) {
  const auto n = static_cast<std::uint32_t>(part.size());
  char bytes[sizeof n];
  std::memcpy(bytes, &n, sizeof n);
  key.append(bytes, sizeof n);
  key.append(part);
}

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool ValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool ValidLabelName(std::string_view name) {
  if (name.empty() || name.starts_with("__")) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (!(IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

// Empty when the definition is valid, else why not.
std::string CheckDefinition(MetricType type, std::string_view name,
                            const std::vector<std::string>& label_names,
                            const std::vector<double>& bounds) {
  if (!ValidMetricName(name)) return "invalid metric name '" + std::string(name) + "'";
  if (label_names.size() > kMaxLabels) return "too many labels on " + std::string(name);
  for (std::size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!ValidLabelName(label)) return "invalid label name '" + label + "' on " + std::string(name);
    if (type == MetricType::kHistogram && label == "le") {
      return "histogram " + std::string(name) + " may not have a label 'le'";
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (label_names[j] == label) return "duplicate label '" + label + "' on " + std::string(name);
    }
  }
  if (type == MetricType::kHistogram) {
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
        return "histogram " + std::string(name) + " bounds must be finite and strictly ascending";
      }
    }
  }
  return {};
}

}  // namespace

std::size_t ShardCount() {
  static const std::size_t count = [] {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    return std::min<std::size_t>(std::bit_ceil(hw), kMaxShards);
  }();
  return count;
}

namespace detail {
std::uint32_t AssignShard() noexcept {
  return g_next_thread.fetch_add(1, std::memory_order_relaxed) &
         static_cast<std::uint32_t>(ShardCount() - 1);
}

std::uint64_t NextUid() noexcept { return g_next_uid.fetch_add(1, std::memory_order_relaxed); }

std::string& LookupKey(std::uint64_t uid) {
  std::string& key = Tls().scratch;
  key.clear();
  AppendUid(key, uid);
  return key;
}

void* CachedLookup(std::string_view key) { return Tls().Find(key); }
void CacheLookup(std::string_view key, void* value) { Tls().Insert(key, value); }
}  // namespace detail

using detail::NextUid;

Counter::Counter() : cells_(new Cell[ShardCount()]) {}

std::uint64_t Counter::Value() const noexcept {
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < ShardCount(); ++i)
    total += cells_[i].value.load(std::memory_order_relaxed);
  return total;
}

Gauge::Gauge() : cells_(new Cell[ShardCount()]) {}

std::int64_t Gauge::Value() const noexcept {
  // Summed as unsigned: per-shard deltas may wrap individually, the total is exact.
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < ShardCount(); ++i) {
    total += static_cast<std::uint64_t>(cells_[i].value.load(std::memory_order_relaxed));
  }
  return static_cast<std::int64_t>(total);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      lines_per_shard_((bounds_.size() + 2 + kCellsPerLine - 1) / kCellsPerLine),
      lines_(new Line[ShardCount() * lines_per_shard_]) {
  for (std::size_t i = 0; i < ShardCount() * lines_per_shard_; ++i) {
    for (auto& cell : lines_[i].cells) cell.store(0, std::memory_order_relaxed);
  }
  const std::uint64_t zero_bits = std::bit_cast<std::uint64_t>(0.0);
  for (std::size_t s = 0; s < ShardCount(); ++s)
    Cell(s, 0).store(zero_bits, std::memory_order_relaxed);
}

void Histogram::Observe(double value) noexcept {
  if (std::isnan(value)) return;
  std::size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  const std::size_t shard = detail::ThisShard();
  Cell(shard, 1 + bucket).fetch_add(1, std::memory_order_relaxed);
  auto& sum = Cell(shard, 0);
  std::uint64_t old_bits = sum.load(std::memory_order_relaxed);
  while (!sum.compare_exchange_weak(
      old_bits, std::bit_cast<std::uint64_t>(std::bit_cast<double>(old_bits) + value),
      std::memory_order_relaxed)) {
  }
}

HistogramData Histogram::Snapshot() const {
  HistogramData data;
  data.buckets.assign(bounds_.size() + 1, 0);
  for (std::size_t s = 0; s < ShardCount(); ++s) {
    data.sum += std::bit_cast<double>(Cell(s, 0).load(std::memory_order_relaxed));
    for (std::size_t b = 0; b < data.buckets.size(); ++b) {
      data.buckets[b] += Cell(s, 1 + b).load(std::memory_order_relaxed);
    }
  }
  for (std::size_t b = 1; b < data.buckets.size(); ++b) data.buckets[b] += data.buckets[b - 1];
  data.count = data.buckets.back();
  return data;
}

const std::vector<double>& DefaultLatencyBuckets() {
  static const std::vector<double> buckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                              0.1,    0.25,  0.5,    1,     2.5,  5,     10};
  return buckets;
}

FamilyBase::FamilyBase(MetricType type, std::string name, std::string help,
                       std::vector<std::string> label_names, std::vector<double> bounds,
                       std::size_t max_series)
    : uid_(NextUid()),
      type_(type),
      name_(std::move(name)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)),
      max_series_(std::max<std::size_t>(1, max_series)),
      sink_(NewMetric()),
      help_(std::move(help)) {}

FamilyBase::~FamilyBase() = default;

std::unique_ptr<Metric> FamilyBase::NewMetric() const {
  switch (type_) {
    case MetricType::kCounter:
      return std::make_unique<Counter>();
    case MetricType::kGauge:
      return std::make_unique<Gauge>();
    case MetricType::kHistogram:
      return std::make_unique<Histogram>(bounds_);
  }
  return std::make_unique<Counter>();
}

std::string FamilyBase::help() const {
  std::shared_lock lock(mu_);
  return help_;
}

std::size_t FamilyBase::size() const {
  std::shared_lock lock(mu_);
  return series_.size();
}

Metric& FamilyBase::Find(std::span<const std::string_view> values) {
  if (values.size() != label_names_.size()) return *sink_;
  std::string& key = detail::LookupKey(uid_);
  for (std::string_view v : values) AppendPart(key, v);
  if (void* cached = detail::CachedLookup(key)) return *static_cast<Metric*>(cached);

  Metric* metric = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = series_.find(std::string_view(key));
    if (it != series_.end()) metric = it->second.metric.get();
  }
  if (metric == nullptr) {
    const bool is_overflow_tuple =
        !values.empty() && std::all_of(values.begin(), values.end(),
                                       [](std::string_view v) { return v == kOverflowLabelValue; });
    std::unique_lock lock(mu_);
    auto it = series_.find(std::string_view(key));
    if (it != series_.end()) {
      metric = it->second.metric.get();
    } else if (series_.size() >= max_series_ || is_overflow_tuple) {
      if (!overflow_) overflow_ = NewMetric();
      metric = overflow_.get();
    } else {
      Series series;
      series.label_values.assign(values.begin(), values.end());
      series.metric = NewMetric();
      metric = series.metric.get();
      series_.emplace(key, std::move(series));
    }
  }
  detail::CacheLookup(key, metric);
  return *metric;
}

FamilySnapshot FamilyBase::Collect() const {
  FamilySnapshot snapshot;
  snapshot.name = name_;
  snapshot.type = type_;
  snapshot.label_names = label_names_;
  snapshot.bounds = bounds_;
  auto sample_of = [this](std::vector<std::string> label_values, const Metric& metric) {
    Sample sample;
    sample.label_values = std::move(label_values);
    switch (type_) {
      case MetricType::kCounter:
        sample.value = static_cast<double>(static_cast<const Counter&>(metric).Value());
        break;
      case MetricType::kGauge:
        sample.value = static_cast<double>(static_cast<const Gauge&>(metric).Value());
        break;
      case MetricType::kHistogram:
        sample.histogram = static_cast<const Histogram&>(metric).Snapshot();
        break;
    }
    return sample;
  };
  {
    std::shared_lock lock(mu_);
    snapshot.help = help_;
    snapshot.samples.reserve(series_.size() + 1);
    for (const auto& [key, series] : series_) {
      snapshot.samples.push_back(sample_of(series.label_values, *series.metric));
    }
    if (overflow_) {
      snapshot.samples.push_back(
          sample_of(std::vector<std::string>(label_names_.size(), std::string(kOverflowLabelValue)),
                    *overflow_));
    }
  }
  std::sort(snapshot.samples.begin(), snapshot.samples.end(),
            [](const Sample& a, const Sample& b) { return a.label_values < b.label_values; });
  return snapshot;
}

Registry::Registry() : Registry(Options{}) {}

Registry::Registry(Options options)
    : uid_(NextUid()),
      options_(options),
      counter_sink_(std::make_unique<Counter>()),
      gauge_sink_(std::make_unique<Gauge>()),
      histogram_sink_(std::make_unique<Histogram>(DefaultLatencyBuckets())) {}

Registry::~Registry() = default;

FamilyBase& Registry::Define(MetricType type, std::string_view name, std::string_view help,
                             std::vector<std::string> label_names, std::vector<double> bounds) {
  if (std::string error = CheckDefinition(type, name, label_names, bounds); !error.empty()) {
    throw std::invalid_argument(error);
  }
  std::unique_lock lock(mu_);
  if (callbacks_.find(name) != callbacks_.end()) {
    throw std::invalid_argument("metric " + std::string(name) + " is already a callback gauge");
  }
  if (auto it = families_.find(name); it != families_.end()) {
    FamilyBase& family = *it->second;
    if (family.type() != type || family.label_names() != label_names || family.bounds() != bounds) {
      throw std::invalid_argument("metric " + std::string(name) +
                                  " redefined with another type, labels or buckets");
    }
    std::unique_lock family_lock(family.mu_);
    if (family.help_.empty()) family.help_ = std::string(help);
    return family;
  }
  return CreateLocked(type, name, help, std::move(label_names), std::move(bounds));
}

FamilyBase& Registry::CreateLocked(MetricType type, std::string_view name, std::string_view help,
                                   std::vector<std::string> label_names,
                                   std::vector<double> bounds) {
  std::unique_ptr<FamilyBase> family;
  const std::size_t cap = options_.max_series_per_family;
  switch (type) {
    case MetricType::kCounter:
      family.reset(new Family<Counter>(type, std::string(name), std::string(help),
                                       std::move(label_names), {}, cap));
      break;
    case MetricType::kGauge:
      family.reset(new Family<Gauge>(type, std::string(name), std::string(help),
                                     std::move(label_names), {}, cap));
      break;
    case MetricType::kHistogram:
      family.reset(new Family<Histogram>(type, std::string(name), std::string(help),
                                         std::move(label_names), std::move(bounds), cap));
      break;
  }
  FamilyBase& ref = *family;
  families_.emplace(std::string(name), std::move(family));
  return ref;
}

CounterFamily& Registry::AddCounter(std::string_view name, std::string_view help,
                                    std::vector<std::string> label_names) {
  return static_cast<CounterFamily&>(
      Define(MetricType::kCounter, name, help, std::move(label_names), {}));
}

GaugeFamily& Registry::AddGauge(std::string_view name, std::string_view help,
                                std::vector<std::string> label_names) {
  return static_cast<GaugeFamily&>(
      Define(MetricType::kGauge, name, help, std::move(label_names), {}));
}

HistogramFamily& Registry::AddHistogram(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds) {
  return static_cast<HistogramFamily&>(
      Define(MetricType::kHistogram, name, help, std::move(label_names), std::move(bounds)));
}

void Registry::SetCallbackGauge(std::string_view name, std::string_view help,
                                std::function<double()> read) {
  SetCallback(MetricType::kGauge, name, help, std::move(read));
}

void Registry::SetCallbackCounter(std::string_view name, std::string_view help,
                                  std::function<double()> read) {
  SetCallback(MetricType::kCounter, name, help, std::move(read));
}

void Registry::SetCallback(MetricType type, std::string_view name, std::string_view help,
                           std::function<double()> read) {
  if (!ValidMetricName(name))
    throw std::invalid_argument("invalid metric name '" + std::string(name) + "'");
  std::unique_lock lock(mu_);
  if (families_.find(name) != families_.end()) {
    throw std::invalid_argument("metric " + std::string(name) + " is already defined");
  }
  if (!read) {
    if (auto it = callbacks_.find(name); it != callbacks_.end()) callbacks_.erase(it);
    return;
  }
  callbacks_.insert_or_assign(
      std::string(name),
      Callback{type, std::string(help), std::make_shared<std::function<double()>>(std::move(read))});
}

FamilyBase* Registry::FindFamily(std::string_view name) {
  std::string& key = detail::LookupKey(uid_);
  key.append(name);
  if (void* cached = detail::CachedLookup(key)) return static_cast<FamilyBase*>(cached);
  FamilyBase* family = nullptr;
  {
    std::shared_lock lock(mu_);
    auto it = families_.find(name);
    if (it == families_.end()) return nullptr;
    family = it->second.get();
  }
  detail::CacheLookup(key, family);
  return family;
}

Metric& Registry::Get(MetricType type, std::string_view name, std::span<const LabelPair> labels) {
  Metric& sink = type == MetricType::kCounter ? static_cast<Metric&>(*counter_sink_)
                 : type == MetricType::kGauge ? static_cast<Metric&>(*gauge_sink_)
                                              : static_cast<Metric&>(*histogram_sink_);
  if (labels.size() > kMaxLabels) return sink;
  FamilyBase* family = FindFamily(name);
  if (family == nullptr) {
    std::vector<std::string> label_names;
    label_names.reserve(labels.size());
    for (const auto& [label, value] : labels) label_names.emplace_back(label);
    std::vector<double> bounds;
    if (type == MetricType::kHistogram) bounds = DefaultLatencyBuckets();
    if (!CheckDefinition(type, name, label_names, bounds).empty()) return sink;
    std::unique_lock lock(mu_);
    if (callbacks_.find(name) != callbacks_.end()) return sink;
    auto it = families_.find(name);
    family = it == families_.end()
                 ? &CreateLocked(type, name, "", std::move(label_names), std::move(bounds))
                 : it->second.get();
  }
  if (family->type() != type) return sink;
  const std::vector<std::string>& names = family->label_names();
  if (names.size() != labels.size()) return sink;
  std::array<std::string_view, kMaxLabels> values;
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto it = std::find_if(labels.begin(), labels.end(),
                           [&](const LabelPair& l) { return l.first == names[i]; });
    if (it == labels.end()) return sink;
    values[i] = it->second;
  }
  return family->Find(std::span<const std::string_view>(values.data(), names.size()));
}

Counter& Registry::GetCounter(std::string_view name, std::initializer_list<LabelPair> labels) {
  return GetCounter(name, std::span<const LabelPair>(labels.begin(), labels.size()));
}
Counter& Registry::GetCounter(std::string_view name, std::span<const LabelPair> labels) {
  return static_cast<Counter&>(Get(MetricType::kCounter, name, labels));
}
Gauge& Registry::GetGauge(std::string_view name, std::initializer_list<LabelPair> labels) {
  return GetGauge(name, std::span<const LabelPair>(labels.begin(), labels.size()));
}
Gauge& Registry::GetGauge(std::string_view name, std::span<const LabelPair> labels) {
  return static_cast<Gauge&>(Get(MetricType::kGauge, name, labels));
}
Histogram& Registry::GetHistogram(std::string_view name, std::initializer_list<LabelPair> labels) {
  return GetHistogram(name, std::span<const LabelPair>(labels.begin(), labels.size()));
}
Histogram& Registry::GetHistogram(std::string_view name, std::span<const LabelPair> labels) {
  return static_cast<Histogram&>(Get(MetricType::kHistogram, name, labels));
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<const FamilyBase*> families;
  std::vector<std::pair<std::string, Callback>> callbacks;
  {
    std::shared_lock lock(mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.push_back(family.get());
    callbacks.assign(callbacks_.begin(), callbacks_.end());
  }
  std::vector<FamilySnapshot> out;
  out.reserve(families.size() + callbacks.size());
  for (const FamilyBase* family : families) out.push_back(family->Collect());
  for (auto& [name, callback] : callbacks) {
    FamilySnapshot snapshot;
    snapshot.name = name;
    snapshot.help = callback.help;
    snapshot.type = callback.type;
    Sample sample;
    sample.value = (*callback.read)();
    snapshot.samples.push_back(std::move(sample));
    out.push_back(std::move(snapshot));
  }
  std::sort(out.begin(), out.end(),
            [](const FamilySnapshot& a, const FamilySnapshot& b) { return a.name < b.name; });
  return out;
}

}  // namespace idemgate::admin
