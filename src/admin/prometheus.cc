#include "admin/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>

namespace idemgate::admin {
namespace {

// Writes `{name="value",...}` (with an optional extra `le` pair), or nothing
// when there are no labels at all.
void AppendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values, std::string_view le = {}) {
  const std::size_t n = std::min(names.size(), values.size());
  if (n == 0 && le.empty()) return;
  out += '{';
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!le.empty()) {
    if (n > 0) out += ',';
    out += "le=\"";
    out += le;
    out += '"';
  }
  out += '}';
}

void AppendLine(std::string& out, std::string_view name, std::string_view suffix,
                const std::vector<std::string>& label_names,
                const std::vector<std::string>& label_values, std::string_view value,
                std::string_view le = {}) {
  out += name;
  out += suffix;
  AppendLabels(out, label_names, label_values, le);
  out += ' ';
  out += value;
  out += '\n';
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

std::string FormatCount(std::uint64_t n) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
  return std::string(buf, end);
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  if (value == std::trunc(value) && std::fabs(value) < 9.2e18) {
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<std::int64_t>(value));
    return std::string(buf, end);
  }
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::general);
  return std::string(buf, end);
}

std::string FormatPrometheus(const std::vector<FamilySnapshot>& families) {
  std::vector<const FamilySnapshot*> ordered(families.size());
  std::transform(families.begin(), families.end(), ordered.begin(),
                 [](const FamilySnapshot& f) { return &f; });
  std::stable_sort(
      ordered.begin(), ordered.end(),
      [](const FamilySnapshot* a, const FamilySnapshot* b) { return a->name < b->name; });

  std::string out;
  for (const FamilySnapshot* family : ordered) {
    if (!family->help.empty()) {
      out += "# HELP ";
      out += family->name;
      out += ' ';
      out += EscapeHelp(family->help);
      out += '\n';
    }
    out += "# TYPE ";
    out += family->name;
    out += ' ';
    out += TypeName(family->type);
    out += '\n';

    std::vector<const Sample*> samples(family->samples.size());
    std::transform(family->samples.begin(), family->samples.end(), samples.begin(),
                   [](const Sample& s) { return &s; });
    std::stable_sort(samples.begin(), samples.end(), [](const Sample* a, const Sample* b) {
      return a->label_values < b->label_values;
    });

    const auto& names = family->label_names;
    for (const Sample* sample : samples) {
      const auto& values = sample->label_values;
      if (family->type != MetricType::kHistogram) {
        AppendLine(out, family->name, "", names, values, FormatValue(sample->value));
        continue;
      }
      const HistogramData& h = sample->histogram;
      for (std::size_t i = 0; i <= family->bounds.size(); ++i) {
        const std::uint64_t cumulative = i < h.buckets.size() ? h.buckets[i] : h.count;
        const std::string le = i < family->bounds.size() ? FormatValue(family->bounds[i]) : "+Inf";
        AppendLine(out, family->name, "_bucket", names, values, FormatCount(cumulative), le);
      }
      AppendLine(out, family->name, "_sum", names, values, FormatValue(h.sum));
      AppendLine(out, family->name, "_count", names, values, FormatCount(h.count));
    }
  }
  return out;
}

}  // namespace idemgate::admin
