// idemctl: the client and operator command line (SPEC §10). Sends requests
// with retries under one Idempotency-Key, parks what still fails in a
// dead-letter queue and replays it under the original key, and reads or
// purges stored keys and statistics through the gateway's admin API.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "client/client.h"
#include "common/ascii.h"
#include "common/text.h"
#include "common/units.h"

namespace idemgate::cli {
namespace {

namespace json = boost::json;
using client::Millis;

constexpr std::string_view kVersion = IDEMGATE_VERSION_STRING;

constexpr std::string_view kUsage =
    "idemctl: send requests that are safe to retry, and operate an idemgate.\n"
    "\n"
    "Usage:\n"
    "  idemctl send [options] URL          send with retries under one Idempotency-Key\n"
    "  idemctl dlq list [--status S] [--json]\n"
    "                                      parked requests (pending|replaying|replayed|discarded)\n"
    "  idemctl dlq show ID [--json]        one parked request, whole (always JSON)\n"
    "  idemctl dlq replay ID               send it again under its original key\n"
    "  idemctl dlq discard ID              give up on a pending request\n"
    "  idemctl dlq release ID [--force]    make a replay cut short (replaying) pending again;\n"
    "                                      refused while its process may still be running\n"
    "  idemctl keys get STORED_KEY         a stored key's record (admin API, needs the token)\n"
    "  idemctl keys purge STORED_KEY [--force]\n"
    "                                      delete a stored key (admin API, needs the token);\n"
    "                                      a key whose request still runs is refused unless\n"
    "                                      --force (which lets a retry run it a second time)\n"
    "  idemctl stats                       per-route statistics (admin API)\n"
    "  idemctl key new [--key-v7]          print a new key (UUIDv4, or v7)\n"
    "  idemctl key derive DOMAIN SUBJECT ENTITY OPERATION VERSION\n"
    "                                      print the stable key of one logical action\n"
    "  idemctl --version | --help\n"
    "Options go before or after the command words. An option with a value is given\n"
    "once (-H repeats). send's request options (-X -H -d -k --key-v7 --derive\n"
    "--key-header), --no-dlq, --force, --status and --json are refused by commands that\n"
    "do not take them (dlq replay sends the request as parked); the retry and TLS\n"
    "options, --dlq, --admin, --token-env, -i and -v go with any command.\n"
    "\n"
    "send options:\n"
    "  -X, --request METHOD   method (default POST with a body, else GET)\n"
    "  -H, --header 'N: V'    a request header (repeatable); a line of the key header gives the key\n"
    "                         (spelled with -, not _: Idempotency_Key is a usage error)\n"
    "  -d, --data TEXT        the body; -d @FILE reads it from FILE, -d @- from stdin\n"
    "  -k, --key KEY          the Idempotency-Key (default: a new UUIDv4); checked as the\n"
    "                         gateway checks it: 1..255 of [A-Za-z0-9._~-], not \"t-...\"\n"
    "      --key-v7           make the key a UUIDv7\n"
    "      --derive D:S:E:O:V the key of a logical action (domain:subject:entity:operation:version,\n"
    "                         none empty)\n"
    "      --key-header NAME  the key's header (default Idempotency-Key); not Host, Content-Length\n"
    "                         or another framing or hop-by-hop field\n"
    "  -i, --include          print the status line and headers before the body\n"
    "  -v, --verbose          print each attempt's outcome (and the wait after it) on stderr\n"
    "\n"
    "retry options (send and dlq replay; durations up to 365d):\n"
    "      --attempts N       attempts in all, 1..100 (default 3)\n"
    "      --base-delay D     first backoff cap (default 250ms)\n"
    "      --max-delay D      longest wait, Retry-After included (default 5s)\n"
    "      --timeout D        per attempt (default 10s)\n"
    "\n"
    "common options:\n"
    "      --dlq FILE         the dead-letter queue (default $IDEMCTL_DLQ, else\n"
    "                         $XDG_DATA_HOME/idemctl/dlq.sqlite (an absolute path), else\n"
    "                         ~/.local/share/idemctl/dlq.sqlite (HOME an absolute path: a\n"
    "                         relative one gives no default), without HOME (unset or empty)\n"
    "                         ./idemctl-dlq.sqlite)\n"
    "      --no-dlq           send: do not park failures\n"
    "      --admin URL        the gateway's admin API (default $IDEMCTL_ADMIN, else\n"
    "                         http://127.0.0.1:9090)\n"
    "      --token-env NAME   environment variable with the admin token (default\n"
    "                         IDEMGATE_ADMIN_TOKEN); keys get|purge need it set\n"
    "      --json             dlq list / show: JSON output\n"
    "\n"
    "TLS options (https:// URLs, for send, dlq replay, keys and stats):\n"
    "      --cacert FILE      trust the CAs in this PEM file instead of the system's\n"
    "                         (default $IDEMCTL_CACERT, else the system's trust store)\n"
    "      --client-cert FILE a client certificate (PEM) for servers that require one\n"
    "      --client-key FILE  its private key (PEM); with --client-cert\n"
    "The server's certificate is always verified: it must chain to a trusted CA and\n"
    "name the URL's host (TLS 1.2 or later). For an https:// request, a file that cannot\n"
    "be opened is a usage error; one that holds no usable PEM fails the attempt.\n"
    "\n"
    "Retried: network errors, timeouts, 408, 409 request-in-flight, 425, 429, 500, 502,\n"
    "503, 504 (full jitter backoff, Retry-After honoured). Never retried: other 4xx\n"
    "(422 key-reused, and a 409 without the code request-in-flight, included). A\n"
    "request that still fails is parked in the DLQ, and so is one whose send SIGTERM\n"
    "or SIGINT stops (a second signal ends idemctl at once).\n"
    "A new key is printed on stderr before the first attempt. Text from the server or the\n"
    "queue file (summaries, -v, dlq list) is printed with control characters escaped\n"
    "(\\t, \\n, \\x1b); --json output holds it escaped as JSON.\n"
    "\n"
    "Exit status: 0 success, 1 the request failed (parked when a DLQ is in use; a\n"
    "response over 64 MiB is a failure, not retried) or an operation failed (dlq list:\n"
    "also when a row could not be read; it is named on stderr and the others are\n"
    "listed; dlq replay: also a replay whose entry was released meanwhile, its result\n"
    "not recorded), 2 usage error: also a request that could never succeed (an empty\n"
    "or refused key, a bad URL, method or header, a missing admin token, an https://\n"
    "request's TLS file that cannot be opened), neither sent nor parked, 3 send: the\n"
    "request was not parked although a DLQ is in use: the DLQ could not be opened\n"
    "(then nothing was sent), or the failed request could not be written to it.\n"
    "Ended by a signal, the shell shows 143 (SIGTERM) or 130 (SIGINT): a second signal\n"
    "during send or dlq replay, or the first while -d @- still reads stdin. Then\n"
    "nothing is parked (a send may have reached the server: its new key is on stderr;\n"
    "an entry being replayed stays replaying, for dlq release).\n";

void Print(FILE* f, std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);
}

int Usage(std::string_view error) {
  Print(stderr, "idemctl: " + Printable(error) + "\nRun 'idemctl --help' for usage.\n");
  return 2;
}

int Fail(std::string_view error) {
  Print(stderr, "idemctl: " + Printable(error) + "\n");
  return 1;
}

// send: a DLQ is in use but the request is not in it (exit 3), so a script
// that takes exit 1 as "parked, to be replayed" does not lose it.
constexpr int kNotParked = 3;

std::string EnvOr(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : std::move(fallback);
}

// Makes each missing directory of `path` 0700, as the XDG Base Directory
// specification asks; existing ones are left as they are. A failure shows
// when the queue file is opened.
void MakeDirectories(const std::filesystem::path& path) {
  std::filesystem::path prefix;
  for (const auto& part : path) {
    prefix /= part;
    if (part == "/" || part.empty()) continue;
    (void)::mkdir(prefix.c_str(), 0700);
  }
}

// The DLQ file: --dlq, else $IDEMCTL_DLQ, else under the XDG data directory
// ($XDG_DATA_HOME when it is an absolute path: the specification says a
// relative one is ignored, else ~/.local/share; without HOME either,
// ./idemctl-dlq.sqlite) in idemctl's own directory, made (or, when it is
// ours, kept) 0700 when `make_directories` (send: the queue holds request
// headers (Authorization) and bodies). The other commands need no queue that
// does not exist yet, so they make no directory: run by root with a user's
// HOME, that would leave directories the user cannot enter.
// A relative HOME is ignored too, and then there is no default (an error):
// a queue under it would move with the current directory.
StatusOr<std::string> DlqPath(const std::string& given, bool make_directories) {
  if (!given.empty()) return given;
  if (const char* v = std::getenv("IDEMCTL_DLQ"); v != nullptr && *v != '\0') return std::string(v);
  std::string data = EnvOr("XDG_DATA_HOME", "");
  if (data.empty() || data.front() != '/') {
    const std::string home = EnvOr("HOME", "");
    if (home.empty()) return std::string("idemctl-dlq.sqlite");
    if (home.front() != '/') {
      // Name what is wrong with XDG_DATA_HOME as it is: unset (or empty), or relative.
      const std::string xdg = data.empty() ? "XDG_DATA_HOME is not set"
                                           : "XDG_DATA_HOME is the relative path \"" + data + "\", ignored too";
      return FailedPreconditionError(
          "no default dead-letter queue: HOME is the relative path \"" + home +
          "\", which is ignored (as a relative XDG_DATA_HOME is), and " + xdg +
          "; give the queue with --dlq FILE or IDEMCTL_DLQ");
    }
    data = home + "/.local/share";
  }
  const std::filesystem::path dir = std::filesystem::path(data) / "idemctl";
  if (!make_directories) return (dir / "dlq.sqlite").string();
  MakeDirectories(data);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno == EEXIST) {
    // Made by an older idemctl with the umask's mode (0755, say): closed to others now.
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
        (st.st_mode & 077) != 0) {
      (void)::chmod(dir.c_str(), 0700);
    }
  }
  return (dir / "dlq.sqlite").string();
}

// What SIGTERM and SIGINT stop during send and dlq replay (StopSignals).
client::Interruption* g_interruption = nullptr;

// The first SIGTERM or SIGINT: both get their default action back (a
// second one ends idemctl at once), and the client stops retrying.
void OnStopSignal(int) {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGTERM, &default_action, nullptr);
  sigaction(SIGINT, &default_action, nullptr);
  if (g_interruption != nullptr) g_interruption->Trigger();
}

// While it lives, the first SIGTERM or SIGINT triggers `interruption`
// instead of ending idemctl: the request is then parked (or its entry put
// back), not lost with its key.
class StopSignals {
 public:
  explicit StopSignals(client::Interruption& interruption) {
    g_interruption = &interruption;
    struct sigaction action {};
    action.sa_handler = OnStopSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, &old_term_);
    sigaction(SIGINT, &action, &old_int_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
    g_interruption = nullptr;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

// Options shared by the subcommands.
struct Options {
  std::string method;
  std::vector<client::Header> headers;
  std::optional<std::string> body;
  std::optional<std::string> key;     // -k, even when empty (a usage error, never a new key)
  bool key_v7 = false;
  std::optional<std::string> derive;  // --derive, even when empty
  std::string key_header = "Idempotency-Key";
  bool include = false;
  bool verbose = false;
  client::RetryPolicy policy;
  std::string dlq;
  bool no_dlq = false;
  std::string admin;
  std::string token_env = "IDEMGATE_ADMIN_TOKEN";
  std::string status_filter;
  bool json = false;
  bool force = false;  // dlq release, keys purge
  bool help = false;   // -h or --help in an option's place (not as an option's value)
  client::TlsSettings tls;  // --cacert ($IDEMCTL_CACERT), --client-cert, --client-key
  bool ca_from_env = false;  // tls.ca_file is $IDEMCTL_CACERT
  std::vector<std::string> positional;
  std::vector<std::string> given;  // each option as typed, in order (CheckOptions)
};

// All of `fd` (a file or stdin) for -d; the error names `what`.
StatusOr<std::string> ReadAll(int fd, const std::string& what) {
  std::string out;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      out.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0) {
      return out;
    } else if (errno != EINTR) {
      return InvalidArgumentError("cannot read " + what + ": " + std::strerror(errno));
    }
  }
}

// The body of -d @FILE: a file that cannot be read (a directory included) is
// an error, never an empty body.
StatusOr<std::string> ReadBodyFile(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("-d @ needs a file name (or - for stdin)");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return InvalidArgumentError("-d @" + path + ": cannot read " + path + ": " + std::strerror(errno));
  struct stat st {};
  StatusOr<std::string> body = InvalidArgumentError("-d @" + path + ": " + path + " is a directory");
  if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) body = ReadAll(fd, path);
  ::close(fd);
  if (!body.ok() && body.status().message().starts_with("cannot")) {
    return InvalidArgumentError("-d @" + path + ": " + body.status().message());
  }
  return body;
}

// The longest --timeout, --base-delay or --max-delay: the library's bound
// (ValidatePolicy), far beyond any use and far from the clocks' limits.
constexpr Millis kMaxDurationArg = client::kMaxPolicyDuration;

StatusOr<Millis> DurationArg(std::string_view text) {
  StatusOr<Duration> d = ParseDuration(text);
  if (!d.ok()) return d.status();
  return std::chrono::duration_cast<Millis>(*d);
}

// The long name of a short option with a value ("-k" -> "--key").
std::string LongName(std::string_view option) {
  if (option == "-X") return "--request";
  if (option == "-d") return "--data";
  if (option == "-k") return "--key";
  return std::string(option);
}

// Parses options and positional arguments after the subcommand words.
std::optional<Options> ParseOptions(const std::vector<std::string>& args, std::string* error) {
  Options o;
  // An option with one value given a second time is an error, never a silent
  // replacement of the first (a request sent under another key, parked elsewhere).
  std::map<std::string, std::string, std::less<>> seen;  // its long name -> the spelling first given
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 1 && a.front() == '-' && a != "-h" && a != "--help") o.given.push_back(a);
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) {
        *error = a + " needs a value";
        return false;
      }
      const std::string name = a.starts_with("--") ? a : LongName(a);
      if (const auto [it, first] = seen.emplace(name, a); !first) {
        *error = (it->second == a ? a + " is given twice"
                                  : it->second + " and " + a + " (the same option) are both given") +
                 ": an option with a value may be given once (only -H repeats)";
        return false;
      }
      *out = args[++i];
      return true;
    };
    auto duration = [&](Millis* out) {
      std::string text;
      if (!value(&text)) return false;
      StatusOr<Millis> d = DurationArg(text);
      if (!d.ok() || d->count() < 0) {
        *error = a + ": invalid duration " + text + " (e.g. 250ms, 5s)";
        return false;
      }
      if (*d > kMaxDurationArg) {
        *error = a + ": " + text + " is too long (at most 365d)";
        return false;
      }
      *out = *d;
      return true;
    };
    std::string v;
    if (a == "-X" || a == "--request") {
      if (!value(&o.method)) return std::nullopt;
      if (o.method.empty()) {
        *error = a + " needs a method (it was empty)";
        return std::nullopt;
      }
      // The gateway refuses such a request (400) on every attempt: never worth parking.
      if (std::any_of(o.method.begin(), o.method.end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
        *error = a + " " + o.method + ": a method with lower-case letters (methods are case-sensitive: POST, not post)";
        return std::nullopt;
      }
    } else if (a == "-H" || a == "--header") {
      if (i + 1 >= args.size()) {
        *error = a + " needs a value";
        return std::nullopt;
      }
      v = args[++i];
      const std::size_t colon = v.find(':');
      if (colon == std::string::npos || colon == 0) {
        *error = "header " + v + " is not 'Name: value'";
        return std::nullopt;
      }
      std::string name = v.substr(0, colon);
      std::string val = v.substr(colon + 1);
      while (!val.empty() && (val.front() == ' ' || val.front() == '\t')) val.erase(0, 1);
      o.headers.emplace_back(std::move(name), std::move(val));
    } else if (a == "-d" || a == "--data") {
      if (!value(&v)) return std::nullopt;
      if (v == "@-") {
        StatusOr<std::string> text = ReadAll(STDIN_FILENO, "stdin");
        if (!text.ok()) {
          *error = "-d @-: " + text.status().message();
          return std::nullopt;
        }
        o.body = std::move(*text);
      } else if (!v.empty() && v.front() == '@') {
        StatusOr<std::string> text = ReadBodyFile(v.substr(1));
        if (!text.ok()) {
          *error = text.status().message();
          return std::nullopt;
        }
        o.body = std::move(*text);
      } else {
        o.body = std::move(v);
      }
    } else if (a == "-k" || a == "--key") {
      if (!value(&v)) return std::nullopt;
      o.key = std::move(v);
    } else if (a == "--key-v7") {
      o.key_v7 = true;
    } else if (a == "--derive") {
      if (!value(&v)) return std::nullopt;
      o.derive = std::move(v);
    } else if (a == "--key-header") {
      if (!value(&o.key_header)) return std::nullopt;
      if (o.key_header.empty()) {
        *error = "--key-header needs a header name (it was empty)";
        return std::nullopt;
      }
    } else if (a == "-i" || a == "--include") {
      o.include = true;
    } else if (a == "-v" || a == "--verbose") {
      o.verbose = true;
    } else if (a == "--attempts") {
      if (!value(&v)) return std::nullopt;
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > client::kMaxAttempts) {
        *error = "--attempts must be 1.." + std::to_string(client::kMaxAttempts);
        return std::nullopt;
      }
      o.policy.max_attempts = static_cast<int>(n);
    } else if (a == "--base-delay") {
      if (!duration(&o.policy.base_delay)) return std::nullopt;
    } else if (a == "--max-delay") {
      if (!duration(&o.policy.max_delay)) return std::nullopt;
    } else if (a == "--timeout") {
      if (!duration(&o.policy.timeout)) return std::nullopt;
      if (o.policy.timeout.count() == 0) {
        *error = "--timeout must be greater than 0";
        return std::nullopt;
      }
    } else if (a == "--dlq") {
      if (!value(&o.dlq)) return std::nullopt;
    } else if (a == "--no-dlq") {
      o.no_dlq = true;
    } else if (a == "--admin") {
      if (!value(&o.admin)) return std::nullopt;
    } else if (a == "--token-env") {
      if (!value(&o.token_env)) return std::nullopt;
    } else if (a == "--status") {
      if (!value(&o.status_filter)) return std::nullopt;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--force") {
      o.force = true;
    } else if (a == "--cacert") {
      if (!value(&o.tls.ca_file)) return std::nullopt;
      if (o.tls.ca_file.empty()) {
        *error = "--cacert needs a file";
        return std::nullopt;
      }
    } else if (a == "--client-cert") {
      if (!value(&o.tls.cert_file)) return std::nullopt;
    } else if (a == "--client-key") {
      if (!value(&o.tls.key_file)) return std::nullopt;
    } else if (a == "-h" || a == "--help") {
      o.help = true;
      return o;  // nothing after it matters
    } else if (a.size() > 1 && a.front() == '-') {
      *error = "unknown option " + a;
      return std::nullopt;
    } else {
      o.positional.push_back(a);
    }
  }
  if (o.tls.cert_file.empty() != o.tls.key_file.empty()) {
    *error = "--client-cert and --client-key go together";
    return std::nullopt;
  }
  if (o.tls.ca_file.empty()) {
    o.tls.ca_file = EnvOr("IDEMCTL_CACERT", "");
    o.ca_from_env = !o.tls.ca_file.empty();
  }
  if (o.admin.empty()) o.admin = EnvOr("IDEMCTL_ADMIN", "http://127.0.0.1:9090");
  while (!o.admin.empty() && o.admin.back() == '/') o.admin.pop_back();
  return o;
}

std::string ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

void PrintResponse(const client::Response& r, bool include) {
  if (include) {
    // The reason phrase that arrived (RFC 9110 §15.5.21 renamed 422, and
    // servers still send the old name); a standard one when none came.
    const std::string reason = r.reason.empty() ? ReasonPhrase(r.status) : r.reason;
    std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + reason + "\r\n";
    for (const auto& [name, value] : r.headers) head += name + ": " + value + "\r\n";
    head += "\r\n";
    Print(stdout, head);
  }
  Print(stdout, r.body);
  if (!r.body.empty() && r.body.back() != '\n' && isatty(fileno(stdout))) Print(stdout, "\n");
}

StatusOr<std::unique_ptr<client::DeadLetterQueue>> OpenDlq(
    const std::string& path, client::DeadLetterQueue::Access access = client::DeadLetterQueue::Access::kCreate) {
  return client::DeadLetterQueue::Open(path, access);
}

std::string FormatTime(std::int64_t unix_ms) { return unix_ms <= 0 ? "-" : client::FormatUtcTime(unix_ms); }

// Bytes as JSON: a string when they are UTF-8, else {"base64": "..."}, so
// the output is always valid JSON and the bytes can be had back exactly.
json::value BytesJson(std::string_view bytes) {
  if (IsValidUtf8(bytes)) return json::string(bytes);
  return json::object{{"base64", Base64(bytes)}};
}

// An entry as JSON. Header names and values are BytesJson, the body is
// `body` (UTF-8) or `body_base64` (anything else); other text is made valid
// UTF-8 (idemctl parks only ASCII URLs, keys and methods).
json::object EntryJson(const client::DeadLetter& e, bool whole) {
  json::object o;
  o["id"] = e.id;
  o["status"] = std::string(client::EntryStatusName(e.status));
  o["method"] = SanitizeUtf8(e.request.method);
  o["url"] = SanitizeUtf8(e.request.url);
  o["key"] = SanitizeUtf8(e.request.key);
  o["attempts"] = e.attempts;
  o["last_status"] = e.last_status;
  o["error"] = SanitizeUtf8(e.error);
  o["last_attempt"] = FormatTime(e.last_attempt_unix_ms);
  o["created"] = FormatTime(e.created_unix_ms);
  if (e.claim) {
    json::object claim;
    claim["host"] = SanitizeUtf8(e.claim->host);
    claim["pid"] = e.claim->pid;
    claim["claimed"] = FormatTime(e.claim->claimed_unix_ms);
    claim["until"] = FormatTime(e.claim->until_unix_ms);
    o["claim"] = std::move(claim);
  } else {
    o["claim"] = nullptr;
  }
  if (whole) {
    o["key_header"] = SanitizeUtf8(e.request.key_header);
    json::array headers;
    for (const auto& [name, value] : e.request.headers) {
      headers.push_back(json::array{BytesJson(name), BytesJson(value)});
    }
    o["headers"] = std::move(headers);
    if (IsValidUtf8(e.request.body)) {
      o["body"] = e.request.body;
    } else {
      o["body_base64"] = Base64(e.request.body);
    }
  }
  return o;
}

// -v: one line per attempt on stderr, e.g. "idemctl: attempt 1: 503
// Service Unavailable; retrying in 250 ms".
void PrintAttempt(const client::AttemptReport& report) {
  std::string line = "idemctl: attempt " + std::to_string(report.attempt) + ": " + Printable(report.summary);
  if (report.wait) line += "; retrying in " + std::to_string(report.wait->count()) + " ms";
  Print(stderr, line + "\n");
}

// Runs `client` and reports the outcome; the exit status.
int Report(const client::Outcome& outcome, const Options& o) {
  if (outcome.response) PrintResponse(*outcome.response, o.include);
  std::string summary = "idemctl: key " + Printable(outcome.key) + ", " + std::to_string(outcome.attempts) +
                        (outcome.attempts == 1 ? " attempt" : " attempts");
  if (outcome.ok) {
    if (o.verbose) Print(stderr, summary + ", done\n");
    return 0;
  }
  summary += ", failed: " + Printable(outcome.error);
  if (outcome.dead_letter_id) summary += "; parked as DLQ entry " + std::to_string(*outcome.dead_letter_id);
  Print(stderr, summary + "\n");
  return 1;
}

// Report for `send`: a failure that a DLQ in use did not take is exit 3.
int ReportSend(const client::Outcome& outcome, const Options& o, bool dlq_in_use) {
  const int code = Report(outcome, o);
  return code == 1 && dlq_in_use && !outcome.dead_letter_id ? kNotParked : code;
}

bool IsHttps(std::string_view url) { return url.size() >= 8 && EqualsIgnoreCaseAscii(url.substr(0, 8), "https://"); }

// For an https:// request: a --cacert, --client-cert or --client-key file
// that cannot be opened (missing, unreadable, a directory) is a usage error,
// found before anything is sent or parked, as for -d @FILE. What it holds is
// checked when the request is sent. "" when they can be opened.
std::string UnreadableTlsFile(const Options& o) {
  const std::pair<const std::string*, std::string> files[] = {
      {&o.tls.ca_file, o.ca_from_env ? "$IDEMCTL_CACERT" : "--cacert"},
      {&o.tls.cert_file, "--client-cert"},
      {&o.tls.key_file, "--client-key"},
  };
  for (const auto& [file, option] : files) {
    if (file->empty()) continue;
    // O_NONBLOCK: a FIFO (--cacert <(...)) opens without waiting for its writer.
    const int fd = ::open(file->c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return option + " " + *file + ": cannot read " + *file + ": " + std::strerror(errno);
    struct stat st {};
    const bool directory = ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    ::close(fd);
    if (directory) return option + " " + *file + ": " + *file + " is a directory";
  }
  return "";
}

// The parts of --derive (domain:subject:entity:operation:version) or of key
// derive: an empty one (an unset shell variable, say) is almost surely a
// mistake, which would still give a key of its own. "" when all are given.
std::string EmptyDerivePart(const std::vector<std::string>& parts, std::string_view what) {
  static constexpr std::string_view kNames[] = {"domain", "subject", "entity", "operation", "version"};
  for (std::size_t i = 0; i < parts.size() && i < 5; ++i) {
    if (parts[i].empty()) return std::string(what) + ": the " + std::string(kNames[i]) + " is empty";
  }
  return "";
}

// Everything is checked before anything is sent or parked: a request that
// could never succeed (an empty or refused key, a bad URL or header) is a
// usage error, not a DLQ entry.
int Send(const Options& o) {
  if (o.positional.size() != 1) return Usage("send needs exactly one URL");
  // A -H line of the key header gives the key, as -k does: dropped, a new
  // key would be sent instead on every run, and each run would execute.
  std::vector<client::Header> headers;
  std::optional<std::string> header_key;
  for (const client::Header& h : o.headers) {
    if (!EqualsIgnoreCaseAscii(h.first, o.key_header)) {
      headers.push_back(h);
      continue;
    }
    if (header_key) return Usage("-H: two " + o.key_header + " headers (give the key once)");
    auto parsed = client::KeyFromHeaderValue(h.second);
    if (!parsed.ok()) return Usage("-H " + h.first + ": " + parsed.status().message());
    header_key = std::move(*parsed);
    const std::string what = "-H " + h.first;
    if (header_key->empty()) return Usage(what + ": the key is empty (leave the header out for a new key)");
    if (Status s = client::ValidateKey(*header_key); !s.ok()) return Usage(what + ": " + s.message());
  }
  if (o.key && header_key && *o.key != *header_key) {
    return Usage("-k " + *o.key + " and the " + o.key_header + " header's key " + *header_key +
                 " differ (give the key once)");
  }
  const std::optional<std::string> given_key = o.key ? o.key : header_key;
  const int key_sources = (given_key ? 1 : 0) + (o.key_v7 ? 1 : 0) + (o.derive ? 1 : 0);
  if (key_sources > 1) {
    return Usage("use only one of --key (or a -H " + o.key_header + " line), --key-v7 and --derive");
  }
  if (o.key) {
    // An empty -k (an unset variable, say) must not turn into a new key:
    // run twice, that would execute the action twice.
    if (o.key->empty()) return Usage("-k: the key is empty (leave -k out for a new key)");
    if (Status s = client::ValidateKey(*o.key); !s.ok()) return Usage("-k: " + s.message());
  }
  client::Request req;
  req.url = o.positional[0];
  req.method = !o.method.empty() ? o.method : (o.body ? "POST" : "GET");
  req.headers = std::move(headers);
  req.body = o.body.value_or("");
  req.key_header = o.key_header;
  if (given_key) {
    req.key = *given_key;
  } else if (o.key_v7) {
    req.key = client::NewKeyV7();
  } else if (o.derive) {
    std::vector<std::string> parts;
    std::stringstream ss(*o.derive);
    std::string part;
    while (std::getline(ss, part, ':')) parts.push_back(part);
    if (parts.size() != 5) return Usage("--derive needs domain:subject:entity:operation:version");
    if (const std::string empty = EmptyDerivePart(parts, "--derive " + *o.derive); !empty.empty()) {
      return Usage(empty);
    }
    req.key = client::DerivedKey(parts[0], parts[1], parts[2], parts[3], parts[4]);
  } else {
    req.key = client::NewKeyV4();
  }
  if (Status s = client::ValidateRequest(req); !s.ok()) return Usage(s.message());
  if (IsHttps(req.url)) {
    if (const std::string bad = UnreadableTlsFile(o); !bad.empty()) return Usage(bad);
  }
  client::Interruption interruption;
  StopSignals stop_signals(interruption);
  std::unique_ptr<client::DeadLetterQueue> dlq;
  if (!o.no_dlq) {
    const auto path = DlqPath(o.dlq, /*make_directories=*/true);
    auto opened = path.ok() ? OpenDlq(*path) : StatusOr<std::unique_ptr<client::DeadLetterQueue>>(path.status());
    if (!opened.ok()) {
      // Checked before sending: a failure could not be parked.
      Print(stderr, "idemctl: " + Printable(opened.status().message()) +
                        "\nidemctl: nothing was sent and nothing parked (fix the dead-letter queue, or send with "
                        "--no-dlq)\n");
      return kNotParked;
    }
    dlq = std::move(*opened);
  }
  client::ClientOptions options;
  options.policy = o.policy;
  options.dlq = dlq.get();
  options.tls = o.tls;
  options.interruption = &interruption;
  if (o.verbose) options.on_attempt = PrintAttempt;
  // A new random key is said before anything is sent: if idemctl is killed
  // outright, the request can still be sent again under it (-k).
  if (!given_key && !o.derive) {
    Print(stderr, "idemctl: new key " + req.key + " (to send this request again: -k " + req.key + ")\n");
  }
  client::Client c(options);
  return ReportSend(c.Send(std::move(req)), o, dlq != nullptr);
}

// A dead-letter id: decimal digits only (no sign, space or other base),
// 1..2^63-1.
std::optional<std::int64_t> ParseEntryId(const std::string& text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  std::int64_t id = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (id > (std::numeric_limits<std::int64_t>::max() - digit) / 10) return std::nullopt;
    id = id * 10 + digit;
  }
  if (id <= 0) return std::nullopt;
  return id;
}

constexpr std::string_view kListHeader = "ID\tSTATUS\tATTEMPTS\tLAST\tMETHOD\tURL\tKEY\tERROR\tCLAIMED BY\n";

int Dlq(const std::string& verb, const Options& o) {
  // The arguments are checked before the queue is opened.
  if (verb != "list" && verb != "show" && verb != "replay" && verb != "discard" && verb != "release") {
    return Usage("unknown dlq command " + verb + " (list, show, replay, discard, release)");
  }
  std::optional<client::EntryStatus> filter;
  std::optional<std::int64_t> id;
  if (verb == "list") {
    if (!o.positional.empty()) return Usage("dlq list takes no arguments");
    if (!o.status_filter.empty()) {
      filter = client::EntryStatusFromName(o.status_filter);
      if (!filter) return Usage("--status must be pending, replaying, replayed or discarded");
    }
  } else {
    if (o.positional.size() != 1) return Usage("dlq " + verb + " needs one entry id");
    id = ParseEntryId(o.positional[0]);
    if (!id) {
      return Usage("dlq " + verb + ": the entry id must be a whole number from 1 to 9223372036854775807 (got \"" +
                   o.positional[0] + "\")");
    }
  }
  const auto path = DlqPath(o.dlq, /*make_directories=*/false);
  if (!path.ok()) return Fail(path.status().message());
  // list and show only read (they work on a queue the user may not write);
  // no command but send creates a queue.
  const bool reads = verb == "list" || verb == "show";
  auto opened =
      OpenDlq(*path, reads ? client::DeadLetterQueue::Access::kRead : client::DeadLetterQueue::Access::kExisting);
  if (!opened.ok()) {
    if (verb == "list" && opened.status().code() == StatusCode::kNotFound) {
      // Nothing parked yet: an empty list, and a word on stderr in case the path is mistyped.
      Print(stderr, "idemctl: " + Printable(opened.status().message()) + "\n");
      Print(stdout, o.json ? std::string("[]\n") : std::string(kListHeader));
      return 0;
    }
    if (id && opened.status().code() == StatusCode::kNotFound) {
      return Fail("no dead letter " + std::to_string(*id) + " (" + opened.status().message() + ")");
    }
    return Fail(opened.status().message());
  }
  client::DeadLetterQueue& dlq = **opened;
  if (verb == "list") {
    auto listing = dlq.List(filter);
    if (!listing.ok()) return Fail(listing.status().message());
    const std::vector<client::DeadLetter>& entries = listing->entries;
    // A row that cannot be read is named on stderr and skipped; the others
    // are listed all the same, and the exit status is 1.
    const auto report_unreadable = [&]() {
      if (listing->unreadable.empty()) return 0;
      std::string text;
      for (const auto& u : listing->unreadable) text += "idemctl: " + Printable(u.error) + "; skipped\n";
      text += "idemctl: " + std::to_string(listing->unreadable.size()) +
              (listing->unreadable.size() == 1 ? " entry" : " entries") +
              " could not be read and " + (listing->unreadable.size() == 1 ? "is" : "are") +
              " not listed (dlq discard ID drops a pending one)\n";
      Print(stderr, text);
      return 1;
    };
    if (o.json) {
      json::array out;
      for (const auto& e : entries) out.push_back(EntryJson(e, false));
      Print(stdout, json::serialize(out) + "\n");
      return report_unreadable();
    }
    std::string text(kListHeader);
    for (const auto& e : entries) {
      // Who is replaying it (host:pid since when), for `dlq release`.
      // Each field Printable: a tab or newline in one (from the queue file)
      // would break the rows, and an escape sequence would reach the terminal.
      const std::string claim = e.claim ? Printable(e.claim->host) + ":" + std::to_string(e.claim->pid) +
                                              " since " + FormatTime(e.claim->claimed_unix_ms)
                                        : "-";
      text += std::to_string(e.id) + "\t" + std::string(client::EntryStatusName(e.status)) + "\t" +
              std::to_string(e.attempts) + "\t" + FormatTime(e.last_attempt_unix_ms) + "\t" +
              Printable(e.request.method) + "\t" + Printable(e.request.url) + "\t" + Printable(e.request.key) +
              "\t" + Printable(e.error) + "\t" + claim + "\n";
    }
    Print(stdout, text);
    return report_unreadable();
  }
  if (verb == "show") {
    auto e = dlq.Get(*id);
    if (!e.ok()) return Fail(e.status().message());
    Print(stdout, json::serialize(EntryJson(*e, true)) + "\n");
    return 0;
  }
  if (verb == "discard") {
    Status s = dlq.Discard(*id);
    if (!s.ok()) return Fail(s.message());
    Print(stderr, "idemctl: entry " + std::to_string(*id) + " discarded\n");
    return 0;
  }
  if (verb == "release") {
    Status s = dlq.Release(*id, o.force);
    if (!s.ok()) {
      return Fail(s.code() == StatusCode::kFailedPrecondition && s.message().find("force") != std::string::npos
                      ? s.message() + " (--force)"
                      : s.message());
    }
    Print(stderr, "idemctl: entry " + std::to_string(*id) + " is pending again\n");
    return 0;
  }
  if (verb == "replay") {
    client::Interruption interruption;
    StopSignals stop_signals(interruption);
    client::ClientOptions options;
    options.policy = o.policy;
    options.dlq = &dlq;
    options.tls = o.tls;
    options.interruption = &interruption;
    if (o.verbose) options.on_attempt = PrintAttempt;
    // The TLS files are checked before the entry is claimed, as send checks them.
    if (auto entry = dlq.Get(*id); entry.ok() && IsHttps(entry->request.url)) {
      if (const std::string bad = UnreadableTlsFile(o); !bad.empty()) return Usage(bad);
    }
    client::Client c(options);
    client::Outcome unrecorded;
    auto outcome = c.Replay(*id, &unrecorded);
    if (!outcome.ok()) {
      // Replayed, but the entry was released meanwhile: the answer is still shown.
      if (unrecorded.response) PrintResponse(*unrecorded.response, o.include);
      return Fail(outcome.status().message());
    }
    const int code = Report(*outcome, o);
    if (code == 0) Print(stderr, "idemctl: entry " + std::to_string(*id) + " replayed\n");
    return code;
  }
  return Usage("unknown dlq command " + verb);
}

// Percent-encodes a stored key for the admin path (it holds ':' and may hold '%').
std::string EncodePathSegment(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'A' && u <= 'Z') || (u >= 'a' && u <= 'z') || (u >= '0' && u <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~' || c == ':') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

// The key calls need the admin token (the gateway refuses them without one,
// whatever its configuration): an unset or empty --token-env variable is a
// usage error, said as such rather than left to a 401. stats sends the token
// only when there is one.
int Admin(const std::string& what, const std::string& verb, const Options& o) {
  client::Request req;  // no key: the admin API is not idempotency-keyed
  const char* token = std::getenv(o.token_env.c_str());
  if (token != nullptr && *token != '\0') {
    req.headers.emplace_back("Authorization", std::string("Bearer ") + token);
  }
  if (what == "stats") {
    if (!o.positional.empty()) return Usage("stats takes no arguments");
    req.method = "GET";
    req.url = o.admin + "/admin/stats";
  } else {
    if (verb != "get" && verb != "purge") return Usage("unknown keys command " + verb + ": keys needs get or purge");
    if (o.positional.size() != 1) return Usage("keys " + verb + " needs one stored key");
    if (o.positional[0].empty()) return Usage("keys " + verb + " needs a stored key (it was empty)");
    req.method = verb == "get" ? "GET" : "DELETE";
    req.url = o.admin + "/admin/keys/" + EncodePathSegment(o.positional[0]);
    // The gateway refuses to purge a key whose request may still run (409
    // key-in-flight) unless asked to.
    if (o.force) req.url += "?force=true";
    if (token == nullptr || *token == '\0') {
      return Usage("keys " + verb + " needs the admin token, but the environment variable " + o.token_env + " is " +
                   (token == nullptr ? "unset" : "empty") + " (set it, or name another with --token-env)");
    }
  }
  if (Status s = client::ValidateRequest(req); !s.ok()) return Usage(s.message());
  if (IsHttps(req.url)) {
    if (const std::string bad = UnreadableTlsFile(o); !bad.empty()) return Usage(bad);
  }
  auto res = client::SendOnce(req, o.policy.timeout, o.tls);
  if (!res.ok()) return Fail("admin API " + o.admin + ": " + res.status().message());
  PrintResponse(*res, o.include);
  if (res->status >= 200 && res->status < 300) return 0;
  Print(stderr, "idemctl: admin API answered " + std::to_string(res->status) + "\n");
  return 1;
}

int Key(const Options& o) {
  if (o.positional.empty()) return Usage("key needs new or derive");
  if (o.positional[0] == "new") {
    if (o.positional.size() != 1) return Usage("key new takes no arguments");
    Print(stdout, (o.key_v7 ? client::NewKeyV7() : client::NewKeyV4()) + "\n");
    return 0;
  }
  if (o.positional[0] == "derive") {
    if (o.positional.size() != 6) return Usage("key derive needs DOMAIN SUBJECT ENTITY OPERATION VERSION");
    const auto& p = o.positional;
    if (const std::string empty = EmptyDerivePart({p.begin() + 1, p.end()}, "key derive"); !empty.empty()) {
      return Usage(empty);
    }
    Print(stdout, client::DerivedKey(p[1], p[2], p[3], p[4], p[5]) + "\n");
    return 0;
  }
  return Usage("unknown key command " + o.positional[0] + " (new, derive)");
}

// The options that change what a command does, and the commands that take
// them; any other command refuses them (a usage error), rather than run
// without what they ask for. The other options (retry, TLS, --dlq, --admin,
// --token-env, -i, -v) are taken by every command and used where they apply.
struct CommandOption {
  std::string_view short_name;  // "" when there is none
  std::string_view long_name;
  std::vector<std::string_view> commands;
  bool shapes_request = false;  // what is sent: dlq replay sends the stored request instead
};

const std::vector<CommandOption>& CommandOptions() {
  static const std::vector<CommandOption> options = {
      {"-X", "--request", {"send"}, true},
      {"-H", "--header", {"send"}, true},
      {"-d", "--data", {"send"}, true},
      {"-k", "--key", {"send"}, true},
      {"", "--key-v7", {"send", "key new"}, true},
      {"", "--derive", {"send"}, true},
      {"", "--key-header", {"send"}, true},
      {"", "--no-dlq", {"send"}},
      {"", "--force", {"dlq release", "keys purge"}},
      {"", "--status", {"dlq list"}},
      {"", "--json", {"dlq list", "dlq show"}},
  };
  return options;
}

// A usage error message for an option given to `command` ("send", "dlq
// replay", "key new", ...) that does not take it; "" when there is none.
std::string RefusedOption(std::string_view command, const Options& o) {
  for (const std::string& given : o.given) {
    for (const CommandOption& option : CommandOptions()) {
      if (given != option.short_name && given != option.long_name) continue;
      if (std::find(option.commands.begin(), option.commands.end(), command) != option.commands.end()) break;
      if (command == "dlq replay" && option.shapes_request) {
        return "dlq replay does not take " + given +
               ": a replay sends the request as it was parked (its method, headers, body and key); "
               "to send another request, use send";
      }
      std::string takers;
      for (std::size_t i = 0; i < option.commands.size(); ++i) {
        takers += (i == 0 ? "" : i + 1 == option.commands.size() ? " and " : ", ") + std::string(option.commands[i]);
      }
      return std::string(command) + " does not take " + given + " (only " + takers + " do" +
             (option.commands.size() == 1 ? "es" : "") + ")";
    }
  }
  return "";
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return Usage("no command");
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    Print(stdout, kUsage);
    return 0;
  }
  if (args[0] == "--version") {
    Print(stdout, "idemctl " + std::string(kVersion) + "\n");
    return 0;
  }
  // Options may come before the command words too (idemctl --token-env T keys get K).
  std::string error;
  std::optional<Options> o = ParseOptions(args, &error);
  if (!o) return Usage(error);
  if (o->help) {
    Print(stdout, kUsage);
    return 0;
  }
  if (o->positional.empty()) return Usage("no command");
  const std::string command = o->positional.front();
  o->positional.erase(o->positional.begin());
  std::string verb;
  if ((command == "dlq" || command == "keys") && !o->positional.empty()) {
    verb = o->positional.front();
    o->positional.erase(o->positional.begin());
  }
  // The command's own options, once the command is known (an unknown one is said as such below).
  std::string what;
  if (command == "send" || command == "stats") {
    what = command;
  } else if ((command == "dlq" && (verb == "list" || verb == "show" || verb == "replay" || verb == "discard" ||
                                   verb == "release")) ||
             (command == "keys" && (verb == "get" || verb == "purge"))) {
    what = command + " " + verb;
  } else if (command == "key" && !o->positional.empty() &&
             (o->positional[0] == "new" || o->positional[0] == "derive")) {
    what = "key " + o->positional[0];
  }
  if (!what.empty()) {
    if (const std::string refused = RefusedOption(what, *o); !refused.empty()) return Usage(refused);
  }
  if (command == "send") return Send(*o);
  if (command == "dlq") return verb.empty() ? Usage("dlq needs list, show, replay, discard or release") : Dlq(verb, *o);
  if (command == "keys") return verb.empty() ? Usage("keys needs get or purge") : Admin("keys", verb, *o);
  if (command == "stats") return Admin("stats", "", *o);
  if (command == "key") return Key(*o);
  return Usage("unknown command " + command);
}

}  // namespace
}  // namespace idemgate::cli

int main(int argc, char** argv) { return idemgate::cli::Main(argc, argv); }
