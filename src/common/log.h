#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

// Structured logging: one line per event, JSON by default (`log.format: text`
// gives logfmt-style "key=value" lines). Each line is built in one string and
// written with one write(2) to the log fd (stdout unless SetLogFd), so lines
// from concurrent threads never interleave and a crash loses at most the line
// being built. Thread-safe; the level and format are process-wide.
namespace idemgate {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };
enum class LogFormat { kJson, kText };

// "debug", "info", "warn", "error".
std::string_view LogLevelName(LogLevel level);
// Parses a level name (as in `log.level`); nullopt for anything else.
std::optional<LogLevel> ParseLogLevel(std::string_view name);

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
// Where lines go (default 1, stdout). The fd is not owned.
void SetLogFd(int fd);

// True when a message at `level` would be written; check it before building
// expensive fields.
bool LogEnabled(LogLevel level);

// One field of a log line. A field holds a string, an integer, a double, a
// bool or null; string values are escaped on output.
class LogField {
 public:
  enum class Kind { kNull, kString, kInt, kDouble, kBool };

  LogField(std::string_view key, std::string_view value) : key_(key), kind_(Kind::kString), str_(value) {}
  LogField(std::string_view key, const char* value) : key_(key), kind_(Kind::kString), str_(value) {}
  LogField(std::string_view key, const std::string& value) : key_(key), kind_(Kind::kString), str_(value) {}
  LogField(std::string_view key, std::int64_t value) : key_(key), kind_(Kind::kInt), int_(value) {}
  LogField(std::string_view key, int value) : key_(key), kind_(Kind::kInt), int_(value) {}
  LogField(std::string_view key, std::uint32_t value) : key_(key), kind_(Kind::kInt), int_(value) {}
  LogField(std::string_view key, std::uint64_t value)
      : key_(key), kind_(Kind::kInt), int_(static_cast<std::int64_t>(value)) {}
  LogField(std::string_view key, double value) : key_(key), kind_(Kind::kDouble), double_(value) {}
  LogField(std::string_view key, bool value) : key_(key), kind_(Kind::kBool), bool_(value) {}
  LogField(std::string_view key, std::nullptr_t) : key_(key), kind_(Kind::kNull) {}
  // A string that is null when absent.
  LogField(std::string_view key, std::optional<std::string_view> value)
      : key_(key), kind_(value ? Kind::kString : Kind::kNull), str_(value.value_or("")) {}

  std::string_view key() const { return key_; }
  Kind kind() const { return kind_; }
  std::string_view str() const { return str_; }
  std::int64_t int_value() const { return int_; }
  double double_value() const { return double_; }
  bool bool_value() const { return bool_; }

 private:
  std::string_view key_;
  Kind kind_;
  std::string_view str_;
  std::int64_t int_ = 0;
  double double_ = 0;
  bool bool_ = false;
};

// Writes {"ts":..., "level":..., "msg":..., fields...} when `level` is
// enabled. Field values need only live for the call.
void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields = {});

inline void LogDebug(std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kDebug, msg, fields);
}
inline void LogInfo(std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kInfo, msg, fields);
}
inline void LogWarn(std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kWarn, msg, fields);
}
inline void LogError(std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kError, msg, fields);
}

// Limits one call site's lines, for lines that can repeat once per request
// (a full or failing store, an unreachable upstream): at most kBurst lines
// per kIntervalMs window; further lines in the window are dropped and
// counted, and the next line written (in a later window) carries a
// `suppressed` field with how many were dropped since the line before it.
// Metrics count the events themselves exactly. Lock-free; constant-
// initialised, so a function-local `static LogLimiter` costs no guard:
//
//   static LogLimiter limiter;
//   LogWarn(limiter, "store failed", {{"error", message}});
//
// Nothing is touched unless the line's level is enabled.
class LogLimiter {
 public:
  static constexpr std::uint32_t kBurst = 10;
  static constexpr std::int64_t kIntervalMs = 1000;

  constexpr LogLimiter() = default;
  LogLimiter(const LogLimiter&) = delete;
  LogLimiter& operator=(const LogLimiter&) = delete;

  // True when a line may be written at `now_ms` (steady clock, in
  // milliseconds); then `*suppressed` is the number of lines refused since
  // the last one allowed.
  bool Allow(std::int64_t now_ms, std::uint64_t* suppressed);

 private:
  std::atomic<std::int64_t> window_start_ms_{0};
  std::atomic<std::uint32_t> in_window_{0};
  std::atomic<std::uint64_t> suppressed_{0};
};

// Log through `limiter`, adding `suppressed` (an integer) to the line when
// lines were dropped before it. The At form takes the time (steady clock,
// milliseconds); exposed for tests.
void Log(LogLimiter& limiter, LogLevel level, std::string_view msg, std::initializer_list<LogField> fields = {});
void LogAt(LogLimiter& limiter, std::int64_t now_ms, LogLevel level, std::string_view msg,
           std::initializer_list<LogField> fields = {});

inline void LogWarn(LogLimiter& limiter, std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(limiter, LogLevel::kWarn, msg, fields);
}
inline void LogError(LogLimiter& limiter, std::string_view msg, std::initializer_list<LogField> fields = {}) {
  Log(limiter, LogLevel::kError, msg, fields);
}

// The per-request line of SPEC §9. Unknown fields stay unset and are written
// as null. Views need only live until WriteRequestLog returns.
struct RequestLogLine {
  std::optional<std::string_view> route;
  std::optional<std::string_view> method;  // null: the request line was not understood
  std::optional<std::string_view> path;
  int status = 0;
  double duration_ms = 0;
  std::optional<std::string_view> tenant;
  std::optional<std::string_view> project;
  std::optional<std::string_view> subject;
  std::optional<std::string_view> idempotency_case;
  std::optional<std::string_view> idempotency_policy;
  std::optional<std::string_view> idempotency_source;
  std::optional<std::string_view> idempotency_key_namespaced;
  std::optional<std::string_view> operation_id;
  std::optional<bool> cache_hit;
  std::optional<std::string_view> outcome;
  std::optional<int> upstream_status;
  std::optional<double> upstream_ms;
  std::optional<std::string_view> request_id;
};

// Appends the line (without the trailing newline) to `out`, in the current
// format; a level "info", msg "request" line. Exposed for tests.
void FormatRequestLog(const RequestLogLine& line, std::string& out);
// Writes the line when info is enabled. Reuses a per-thread buffer.
void WriteRequestLog(const RequestLogLine& line);

// Appends `s` JSON-escaped (without quotes) to `out`: ", \ and control
// characters escaped, invalid UTF-8 bytes replaced by U+FFFD.
void AppendJsonEscaped(std::string_view s, std::string& out);

}  // namespace idemgate
