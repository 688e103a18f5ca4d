#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <ctime>

namespace idemgate {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kJson)};
std::atomic<int> g_fd{1};

void WriteAll(std::string_view line) {
  const int fd = g_fd.load(std::memory_order_relaxed);
  const char* p = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report a failing log sink
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Length of the valid UTF-8 sequence starting at s[i] (2..4), or 0.
std::size_t Utf8SequenceLength(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t len = 0;
  std::uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
      cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return len;
}

// "2024-01-31T12:34:56.789Z", with the seconds part cached per thread.
void AppendTimestamp(std::string& out) {
  const auto now = std::chrono::system_clock::now();
  const auto ms_total =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::int64_t secs = ms_total / 1000;
  const int ms = static_cast<int>(ms_total % 1000);
  thread_local std::int64_t cached_secs = -1;
  thread_local char cached[24];
  if (secs != cached_secs) {
    const std::time_t t = static_cast<std::time_t>(secs);
    std::tm tm{};
    gmtime_r(&t, &tm);
    auto put = [](char* p, int v, int width) {
      for (int i = width - 1; i >= 0; --i) {
        p[i] = static_cast<char>('0' + v % 10);
        v /= 10;
      }
    };
    put(cached, tm.tm_year + 1900, 4);
    cached[4] = '-';
    put(cached + 5, tm.tm_mon + 1, 2);
    cached[7] = '-';
    put(cached + 8, tm.tm_mday, 2);
    cached[10] = 'T';
    put(cached + 11, tm.tm_hour, 2);
    cached[13] = ':';
    put(cached + 14, tm.tm_min, 2);
    cached[16] = ':';
    put(cached + 17, tm.tm_sec, 2);
    cached_secs = secs;
  }
  out.append(cached, 19);
  char frac[5] = {'.', static_cast<char>('0' + ms / 100), static_cast<char>('0' + ms / 10 % 10),
                  static_cast<char>('0' + ms % 10), 'Z'};
  out.append(frac, 5);
}

void AppendInt(std::int64_t v, std::string& out) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  (void)ec;
  out.append(buf, end);
}

void AppendDouble(double v, std::string& out) {
  char buf[32];
  // Three decimals: durations in milliseconds with microsecond resolution.
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed, 3);
  if (ec != std::errc()) {
    out += "null";
    return;
  }
  out.append(buf, end);
}

bool NeedsQuotes(std::string_view s) {
  if (s.empty()) return true;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || c == '"' || c == '=' || c == '\\' || u >= 0x7F) return true;
  }
  return false;
}

// One "key":value (JSON) or key=value (text) pair, with its separator.
class LineBuilder {
 public:
  LineBuilder(std::string& out, LogFormat format) : out_(out), format_(format) {
    out_ += format_ == LogFormat::kJson ? "{" : "";
  }

  void Key(std::string_view key) {
    if (format_ == LogFormat::kJson) {
      if (!first_) out_ += ',';
      out_ += '"';
      out_ += key;
      out_ += "\":";
    } else {
      if (!first_) out_ += ' ';
      out_ += key;
      out_ += '=';
    }
    first_ = false;
  }

  void String(std::string_view key, std::string_view value) {
    Key(key);
    if (format_ == LogFormat::kJson || NeedsQuotes(value)) {
      out_ += '"';
      AppendJsonEscaped(value, out_);
      out_ += '"';
    } else {
      out_ += value;
    }
  }
  void Null(std::string_view key) {
    Key(key);
    out_ += format_ == LogFormat::kJson ? "null" : "-";
  }
  void Int(std::string_view key, std::int64_t v) {
    Key(key);
    AppendInt(v, out_);
  }
  void Double(std::string_view key, double v) {
    Key(key);
    AppendDouble(v, out_);
  }
  void Bool(std::string_view key, bool v) {
    Key(key);
    out_ += v ? "true" : "false";
  }
  void OptString(std::string_view key, const std::optional<std::string_view>& v) {
    if (v) {
      String(key, *v);
    } else {
      Null(key);
    }
  }
  void Field(const LogField& f) {
    switch (f.kind()) {
      case LogField::Kind::kNull: Null(f.key()); break;
      case LogField::Kind::kString: String(f.key(), f.str()); break;
      case LogField::Kind::kInt: Int(f.key(), f.int_value()); break;
      case LogField::Kind::kDouble: Double(f.key(), f.double_value()); break;
      case LogField::Kind::kBool: Bool(f.key(), f.bool_value()); break;
    }
  }
  void Begin(LogLevel level, std::string_view msg) {
    Key("ts");
    if (format_ == LogFormat::kJson) out_ += '"';
    AppendTimestamp(out_);
    if (format_ == LogFormat::kJson) out_ += '"';
    String("level", LogLevelName(level));
    String("msg", msg);
  }
  void End() { out_ += format_ == LogFormat::kJson ? "}" : ""; }

 private:
  std::string& out_;
  LogFormat format_;
  bool first_ = true;
};

std::string& ThreadBuffer() {
  thread_local std::string buffer;
  buffer.clear();
  return buffer;
}

}  // namespace

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

std::optional<LogLevel> ParseLogLevel(std::string_view name) {
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (LogLevelName(l) == name) return l;
  }
  return std::nullopt;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void SetLogFormat(LogFormat format) { g_format.store(static_cast<int>(format), std::memory_order_relaxed); }
LogFormat GetLogFormat() { return static_cast<LogFormat>(g_format.load(std::memory_order_relaxed)); }
void SetLogFd(int fd) { g_fd.store(fd, std::memory_order_relaxed); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

void AppendJsonEscaped(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      // Copy the longest plain run at once.
      std::size_t j = i + 1;
      while (j < s.size()) {
        const auto d = static_cast<unsigned char>(s[j]);
        if (d < 0x20 || d >= 0x7F || d == '"' || d == '\\') break;
        ++j;
      }
      out.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 15];
      }
      ++i;
    } else {
      const std::size_t len = Utf8SequenceLength(s, i);
      if (len == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(s.data() + i, len);
        i += len;
      }
    }
  }
}

namespace {

void WriteLine(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields,
               const LogField* extra) {
  std::string& out = ThreadBuffer();
  LineBuilder b(out, GetLogFormat());
  b.Begin(level, msg);
  for (const LogField& f : fields) b.Field(f);
  if (extra != nullptr) b.Field(*extra);
  b.End();
  out += '\n';
  WriteAll(out);
}

}  // namespace

void Log(LogLevel level, std::string_view msg, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  WriteLine(level, msg, fields, nullptr);
}

bool LogLimiter::Allow(std::int64_t now_ms, std::uint64_t* suppressed) {
  std::int64_t start = window_start_ms_.load(std::memory_order_relaxed);
  if (now_ms - start >= kIntervalMs &&
      window_start_ms_.compare_exchange_strong(start, now_ms, std::memory_order_relaxed)) {
    // This thread opened the window. A line counted by another thread
    // between the two stores goes to the new window: a burst may be one or
    // two lines off, never unbounded, and no refused line is lost.
    in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) < kBurst) {
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

void LogAt(LogLimiter& limiter, std::int64_t now_ms, LogLevel level, std::string_view msg,
           std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  std::uint64_t suppressed = 0;
  if (!limiter.Allow(now_ms, &suppressed)) return;
  if (suppressed == 0) {
    WriteLine(level, msg, fields, nullptr);
  } else {
    const LogField extra("suppressed", suppressed);
    WriteLine(level, msg, fields, &extra);
  }
}

void Log(LogLimiter& limiter, LogLevel level, std::string_view msg, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  LogAt(limiter, std::chrono::duration_cast<std::chrono::milliseconds>(now).count(), level, msg, fields);
}

void FormatRequestLog(const RequestLogLine& line, std::string& out) {
  LineBuilder b(out, GetLogFormat());
  b.Begin(LogLevel::kInfo, "request");
  b.OptString("route", line.route);
  b.OptString("method", line.method);
  b.OptString("path", line.path);
  if (line.status != 0) {
    b.Int("status", line.status);
  } else {
    b.Null("status");  // no answer reached the client
  }
  b.Double("duration_ms", line.duration_ms);
  b.OptString("tenant", line.tenant);
  b.OptString("project", line.project);
  b.OptString("subject", line.subject);
  b.OptString("idempotency_case", line.idempotency_case);
  b.OptString("idempotency_policy", line.idempotency_policy);
  b.OptString("idempotency_source", line.idempotency_source);
  b.OptString("idempotency_key_namespaced", line.idempotency_key_namespaced);
  b.OptString("operation_id", line.operation_id);
  if (line.cache_hit) {
    b.Bool("cache_hit", *line.cache_hit);
  } else {
    b.Null("cache_hit");
  }
  b.OptString("outcome", line.outcome);
  if (line.upstream_status) {
    b.Int("upstream_status", *line.upstream_status);
  } else {
    b.Null("upstream_status");
  }
  if (line.upstream_ms) {
    b.Double("upstream_ms", *line.upstream_ms);
  } else {
    b.Null("upstream_ms");
  }
  b.OptString("request_id", line.request_id);
  b.End();
}

void WriteRequestLog(const RequestLogLine& line) {
  if (!LogEnabled(LogLevel::kInfo)) return;
  std::string& out = ThreadBuffer();
  FormatRequestLog(line, out);
  out += '\n';
  WriteAll(out);
}

}  // namespace idemgate
