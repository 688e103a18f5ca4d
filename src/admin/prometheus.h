#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "admin/snapshot.h"

// Prometheus text exposition format 0.0.4. Pure functions, thread-safe.
namespace idemgate::admin {

// Content-Type of FormatPrometheus output.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Renders `families` as one exposition: per family a `# HELP` line (omitted
// when the help text is empty) and a `# TYPE` line, then its samples.
// Families are ordered by name and samples by label values, whatever the
// input order, so equal inputs give byte-equal outputs. Histograms expand to
// `_bucket{...,le="..."}` lines (cumulative, ending with le="+Inf"), `_sum`
// and `_count`. Integral values print without a fraction ("42"), others in
// the shortest form that reads back exactly; NaN and infinities as "NaN",
// "+Inf", "-Inf".
std::string FormatPrometheus(const std::vector<FamilySnapshot>& families);

// Label value escaping: backslash, double quote and line feed become
// `\\`, `\"` and `\n`.
std::string EscapeLabelValue(std::string_view value);
// HELP text escaping: backslash and line feed become `\\` and `\n`.
std::string EscapeHelp(std::string_view help);
// A sample value as the format spells it (see FormatPrometheus).
std::string FormatValue(double value);

}  // namespace idemgate::admin
