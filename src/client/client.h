#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

// libidemclient (SPEC §10): the client side of safe retries. One key per
// logical action, reused on every retry; retries with capped exponential
// backoff and full jitter, honouring Retry-After; what still fails is parked
// in a dead-letter queue (a SQLite file) from which it can be replayed under
// its original key, so a replay can never execute twice.
//
// HTTP/1.1 over TCP, or over TLS for https:// URLs (TlsSettings below).
// Synchronous; a Client may be used from one thread at a time, a
// DeadLetterQueue from several (SQLite serialises them).
namespace idemgate::client {

using Millis = std::chrono::milliseconds;
using Header = std::pair<std::string, std::string>;

// ---------------------------------------------------------------------------
// Keys

// A random UUID version 4, lower-case ("6f1c…-4…-[89ab]…"), from OpenSSL's RAND_bytes.
std::string NewKeyV4();
// A UUID version 7 (RFC 9562): 48-bit Unix milliseconds of `now`, then random bits.
std::string NewKeyV7(std::chrono::system_clock::time_point now = std::chrono::system_clock::now());
// Case C (SPEC §10): the same key whenever the same action is named, from
// any process: a UUID version 8 made of the first 122 bits of SHA-256 over
// the five parts, each length-prefixed (so no two part lists collide).
std::string DerivedKey(std::string_view domain, std::string_view subject, std::string_view entity,
                       std::string_view operation, std::string_view version);
// InvalidArgument when a gateway with the default key rules (SPEC §3, the
// gateway's own check: core::ValidateRawKey with default KeyRules) would
// refuse `key` as sent: empty, longer than 255 characters, a colon, a
// character outside [A-Za-z0-9._~-], or the reserved prefix "t-". The
// message names the key and the rule. Keys from NewKeyV4, NewKeyV7 and
// DerivedKey always pass. A route configured with a wider `key.charset` or
// `key.max_length` accepts more than this.
Status ValidateKey(std::string_view key);

// ---------------------------------------------------------------------------
// Retry policy

struct RetryPolicy {
  int max_attempts = 3;      // attempts in all, the first included (>= 1)
  Millis base_delay{250};    // the first backoff's cap
  Millis max_delay{5000};    // no backoff is longer (Retry-After is capped by it too)
  Millis timeout{10000};     // per attempt: name lookup, connect, send and the whole response
};

// The bounds of a RetryPolicy, the same as idemctl's options (--attempts,
// --base-delay, --max-delay, --timeout): far beyond any use, and far from the
// clocks' limits, so no sum of them overflows.
inline constexpr int kMaxAttempts = 100;
inline constexpr Millis kMaxPolicyDuration = std::chrono::days(365);

// InvalidArgument, naming the field, its value and the bounds, when `policy`
// is outside them: max_attempts 1..100, base_delay and max_delay 0..365 days,
// timeout 1 ms..365 days. Client::Send and Client::Replay apply it first.
Status ValidatePolicy(const RetryPolicy& policy);

enum class Verdict {
  kSuccess,  // 1xx..3xx: done
  kRetry,    // worth another attempt: transport error or timeout (status 0), 408, 409 request-in-flight,
             // 425, 429, 500, 502, 503, 504
  kFail,     // final failure: any other status (other 4xx, 422 key-reused, other 5xx)
};

// `status` 0 means no response (transport error or timeout). `problem_code`
// is the `code` of an application/problem+json body ("" when there is
// none): a 409 is retried only as request-in-flight (the gateway's answer
// while the key's first request runs), never without a code (an upstream's
// own conflict, which another attempt would run again).
Verdict Classify(int status, std::string_view problem_code);

// The wait before attempt `next_attempt` (2 for the first retry): full
// jitter, uniform in [0, min(max_delay, base_delay * 2^(next_attempt-2))],
// drawn from `random` (any 64-bit value).
Millis BackoffDelay(const RetryPolicy& policy, int next_attempt, std::uint64_t random);

// A Retry-After value: delay-seconds or an HTTP-date (an IMF-fixdate, or
// the obsolete RFC 850 or asctime forms that RFC 9110 §5.6.7 has recipients
// accept: "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"), as a
// wait from `now` (never negative); nullopt when it is neither. A two-digit
// RFC 850 year is the one with those digits that puts the date at most 50
// years after `now` and less than 50 before it, comparing whole dates and
// times: one that appears more than 50 years ahead is in the past century.
std::optional<Millis> ParseRetryAfter(std::string_view value, std::chrono::system_clock::time_point now);

// ---------------------------------------------------------------------------
// Requests

struct Request {
  std::string method = "POST";
  std::string url;              // http://host[:port]/path[?query] or https://host[:port]/path[?query]
  std::vector<Header> headers;  // sent as given (Host and Content-Length are added)
  std::string body;
  // The raw key. Empty: the key of the one line of the key header in
  // `headers` (RequestKey), else Client::Send makes a NewKeyV4.
  std::string key;
  // Sent as an sf-string: "key". Not a framing or hop-by-hop field (Host,
  // Content-Length, ...: ValidateRequest refuses those).
  std::string key_header = "Idempotency-Key";
  // The largest response body read; a larger one fails the attempt
  // (ResourceExhausted) as soon as the limit is passed. Not kept in the DLQ.
  std::uint64_t max_response_bytes = 64ULL * 1024 * 1024;
};

struct Response {
  int status = 0;
  std::string reason;  // the reason phrase of the status line, as received (may be empty)
  std::vector<std::pair<std::string, std::string>> headers;  // as received (the Header type)
  std::string body;
  // The first value of header `name` (case-insensitive).
  std::optional<std::string> Header(std::string_view name) const;
  // The `code` of a problem+json body, or "".
  std::string ProblemCode() const;
};

// How an https:// request trusts the server and, for mutual TLS, which
// client certificate it presents. Used only for https:// URLs (http:// ones
// ignore it). The server's certificate is always verified (TLS 1.2 at
// least): its chain must lead to a trusted CA and it must carry the URL's
// host (a DNS name, sent as SNI too; or an IP address, matched against its
// IP subjectAltNames). There is no switch to skip that check.
struct TlsSettings {
  // PEM file with the CAs to trust (instead of the system's); empty: the
  // system's trust store (OpenSSL's default verify paths, where
  // SSL_CERT_FILE and SSL_CERT_DIR apply).
  std::string ca_file;
  // A client certificate chain (PEM, leaf first) and its private key (PEM,
  // unencrypted) for servers that require one: both or neither.
  std::string cert_file;
  std::string key_file;
};

// Stops a Client from outside its thread, e.g. on SIGTERM: Trigger() ends a
// wait between attempts at once and cuts an attempt in progress (its
// connection is closed; the request may have reached the server or not),
// and no further attempt is made. Once triggered it stays triggered.
// Thread-safe; Trigger() is async-signal-safe (it stores a flag and writes a
// byte to a pipe), so a signal handler may call it.
class Interruption {
 public:
  Interruption();
  ~Interruption();
  Interruption(const Interruption&) = delete;
  Interruption& operator=(const Interruption&) = delete;

  void Trigger() noexcept;
  bool triggered() const noexcept { return triggered_.load(std::memory_order_acquire); }
  // Waits `wait`, or less when triggered meanwhile; true when triggered.
  bool SleepFor(Millis wait) const;
  // Readable once triggered (for poll or an event loop), -1 when no pipe
  // could be made (then attempts in progress are not cut). Owned by this object.
  int fd() const noexcept { return read_fd_; }

 private:
  std::atomic<bool> triggered_{false};
  int read_fd_ = -1;
  int write_fd_ = -1;
};

// One attempt: looks the host up, connects (and, for https://, completes a
// TLS handshake with `tls`), sends `request` (with its key header), reads the
// whole response (at most request.max_response_bytes), all within `timeout`
// (the lookup runs on a thread of its own, and one that does not answer in
// time is given up on). An error Status when there is no
// response: Unavailable (connection or TLS handshake failed, e.g. "TLS
// handshake with HOST:PORT failed: certificate verify failed (hostname
// mismatch)"), DeadlineExceeded, InvalidArgument for a bad URL or request,
// for a `timeout` under 1 ms, or for unusable `tls` files (naming the file),
// Aborted when `interruption` was triggered before or during the exchange
// ("interrupted ..."). A `timeout` too long for the clock to add (centuries)
// sets no deadline.
StatusOr<Response> SendOnce(const Request& request, Millis timeout, const TlsSettings& tls = {},
                            const Interruption* interruption = nullptr);

// InvalidArgument, naming the bad part, when no attempt could ever send
// `request`: a URL that is not http:// or https:// with a host (a space,
// control character or non-ASCII byte in it included), a method or header
// name that is not a token, a header name or value, a key (as an sf-string)
// or a host over 65533 bytes, a header value with a control character other
// than a tab (CR, LF and NUL included; RFC 9110 §5.5), two Host lines (RFC
// 9112 §3.2) or two Content-Length lines (the key's line counted), a
// key_header that frames the request or belongs to its connection (Host,
// Content-Length, Transfer-Encoding, Connection, Keep-Alive, TE, Trailer,
// Upgrade, Expect, Proxy-Connection; ignoring case and '_' for '-'), a key
// without a key header name or that an sf-string cannot
// carry (only printable ASCII), lines of the key header that RequestKey
// refuses, a line whose name differs from the key header only by '_' for '-'
// (Idempotency_Key: it gives no key, and the gateway drops it), a
// Content-Length that does not match the body, Transfer-Encoding.
// SendOnce makes the same checks; this one does no I/O and reads no TLS file.
Status ValidateRequest(const Request& request);

// The key in the value of a line of the key header, as idemctl -H takes it:
// an sf-string ("abc", as the key is sent; only \" and \\ escaped, no
// parameters) or the bare key; surrounding spaces and tabs are not part of
// it. InvalidArgument, saying why, for an sf-string that is not one of these.
StatusOr<std::string> KeyFromHeaderValue(std::string_view value);

// The key `request` is sent under. A line of its key header in `headers` (the
// name in any case) gives the key as `key` does: with `key` empty, the one
// such line's key (KeyFromHeaderValue) is the key; with `key` set, a line
// must name the same key. "" when neither gives one (Client::Send then makes
// a NewKeyV4; SendOnce sends no key). InvalidArgument for two such lines, a
// line whose value gives no key (or an empty one), or one naming another key.
// SendOnce and Client::Send send the key as an sf-string in place of the line.
StatusOr<std::string> RequestKey(const Request& request);

// ---------------------------------------------------------------------------
// Dead-letter queue

enum class EntryStatus { kPending, kReplaying, kReplayed, kDiscarded };
std::string_view EntryStatusName(EntryStatus status);  // "pending", "replaying", "replayed", "discarded"
std::optional<EntryStatus> EntryStatusFromName(std::string_view name);

// Who is replaying an entry (status replaying): recorded by ClaimForReplay
// so that Release can tell a replay that is still running from one cut short.
struct ReplayClaim {
  std::string token;  // random, this replay's own; its FinishReplay must match it
  std::string host;   // gethostname() of the claiming process
  std::int64_t pid = 0;
  std::int64_t claimed_unix_ms = 0;
  // When the replay will have ended at the latest (its attempts, timeouts and
  // waits); 0 when unknown.
  std::int64_t until_unix_ms = 0;
};

struct DeadLetter {
  std::int64_t id = 0;
  Request request;         // target (url), method, headers, body, key, key_header
  std::string error;       // the last failure, e.g. "503 Service Unavailable" or "connection refused"
  int attempts = 0;        // attempts so far, replays included
  int last_status = 0;     // the last response's status, 0 without one
  std::int64_t last_attempt_unix_ms = 0;
  std::int64_t created_unix_ms = 0;
  EntryStatus status = EntryStatus::kPending;
  // Set while replaying, unless the claim predates the claim record (a queue
  // written by an older idemctl).
  std::optional<ReplayClaim> claim;
};

// A row of the queue that cannot be read as an entry: a value of the wrong
// type or out of range, headers that are not the JSON Park writes, an unknown
// status (written by another program, or edited by hand).
struct UnreadableEntry {
  std::int64_t id = 0;
  std::string error;  // "dead letter 7 cannot be read: column headers is not JSON (...)"
};

// What List found: the entries it could read, and the rows it skipped.
struct DeadLetterListing {
  std::vector<DeadLetter> entries;           // oldest first
  std::vector<UnreadableEntry> unreadable;   // by id
};

// A Unix time in milliseconds as UTC, to the second: "2026-01-02T03:04:05Z".
std::string FormatUtcTime(std::int64_t unix_ms);

class DeadLetterQueue {
 public:
  // How Open treats the file.
  enum class Access {
    kCreate,    // read and write; a missing file is created (parking)
    kExisting,  // read and write; a missing file (or directory) is NotFound (replay, discard, release)
    kRead,      // read only; a missing file (or directory) is NotFound (list, show). Needs no write
                // access to the file, only to its directory while no writer has it open
                // (SQLite's WAL index); a version 1 file is read as it is, not migrated.
                // Where this process may write the file and its directory, the connection
                // may write (and writes nothing: query_only), so that the last one to close
                // removes the -wal and -shm files, which a read-only one would leave behind
  };
  // Opens the SQLite file at `path`, with a schema version check; WAL journal,
  // busy timeout of 5 s (the switch of a new file to WAL, which SQLite does not
  // wait for by itself, included). A file that kCreate makes is readable and
  // writable by its owner only (0600, and so are its -wal and -shm files).
  // kCreate and kExisting on a file this process may not write fail with
  // FailedPrecondition ("... is read-only ..."). A directory this process
  // may not enter is said to be one ("... cannot be entered by this user"),
  // not to be missing; none is ever created.
  static StatusOr<std::unique_ptr<DeadLetterQueue>> Open(const std::string& path, Access access = Access::kCreate);
  ~DeadLetterQueue();
  DeadLetterQueue(const DeadLetterQueue&) = delete;
  DeadLetterQueue& operator=(const DeadLetterQueue&) = delete;

  // Parks a failed request as pending; returns its id.
  StatusOr<std::int64_t> Park(const Request& request, std::string_view error, int attempts, int last_status);
  // Entries, oldest first; only those with `status` when given. Without
  // their bodies (request.body is empty: Get has it), so that a listing's
  // memory does not grow with the bytes queued; the body column's type is
  // checked all the same. A row that cannot be read is skipped and named in
  // `unreadable` (one bad row hides no other); an error only when the queue
  // itself cannot be read.
  StatusOr<DeadLetterListing> List(std::optional<EntryStatus> status = std::nullopt) const;
  // NotFound when there is no such entry; FailedPrecondition ("dead letter
  // ID cannot be read: ...") for a row List would skip.
  StatusOr<DeadLetter> Get(std::int64_t id) const;
  // pending -> replaying, atomically: FailedPrecondition (naming the status)
  // when the entry is not pending, so two replays of one entry never both run;
  // FailedPrecondition too, leaving it pending, when it cannot be read.
  // Records the claim (a new token, this host and process, now, and
  // now + `longest`: how long the replay may run at most; 0 or less: unknown,
  // and a sum past the year 292 million is taken as that).
  StatusOr<DeadLetter> ClaimForReplay(std::int64_t id, Millis longest = Millis{0});
  // replaying -> replayed (success) or back to pending with the new error,
  // attempts added and the last status; the last attempt's time becomes now,
  // unless `attempts` is 0 (none was made). Only for the claim this object made:
  // when the entry was released meanwhile (and perhaps claimed again), the
  // result is not recorded (FailedPrecondition saying so) and the entry is
  // left as it is.
  Status FinishReplay(std::int64_t id, bool replayed, std::string_view error, int attempts, int last_status);
  // pending -> discarded (FailedPrecondition from another status). Discard
  // and Release need only the entry's status and claim: an entry whose
  // request cannot be read can be discarded, or released, all the same.
  Status Discard(std::int64_t id);
  // replaying -> pending: gives back an entry whose replay was cut short
  // (its process died) so it can be replayed again (FailedPrecondition from
  // another status). Refused (FailedPrecondition, naming the claimant) while
  // the replay may still be running: its process is alive on this host, or,
  // claimed on another host, its longest run has not ended. `force` skips
  // that check; the replay it frees, if still running, can no longer record
  // its result.
  Status Release(std::int64_t id, bool force = false);

 private:
  struct Impl;
  explicit DeadLetterQueue(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Client

struct Outcome {
  bool ok = false;                    // the final answer was a success (kSuccess)
  std::optional<Response> response;   // the last response, when there was one
  std::string error;                  // why it failed (the last transport error or status), "" when ok
  int attempts = 0;
  std::string key;                    // the key every attempt carried
  std::optional<std::int64_t> dead_letter_id;  // set when the request was parked
  // InvalidArgument (from ValidateRequest) when the request could never be
  // sent: then nothing was sent (attempts 0) nor parked, and `error` is its
  // message. Ok otherwise, failed attempts included.
  Status validation;
  // Stopped by ClientOptions::interruption before it succeeded: `error` says
  // when ("interrupted ..."). A failure like any other: Send parks it.
  bool interrupted = false;
};

// What one attempt came to, for ClientOptions::on_attempt.
struct AttemptReport {
  int attempt = 0;              // 1 for the first
  bool ok = false;              // a success (kSuccess)
  int status = 0;               // the response's status, 0 without one
  std::string summary;          // "201 Created", "503 Service Unavailable", or the transport error
  std::optional<Millis> wait;   // the wait before the next attempt, when one follows
};

struct ClientOptions {
  RetryPolicy policy;
  DeadLetterQueue* dlq = nullptr;  // optional; not owned
  // For https:// targets, on every attempt (sends and replays alike). A bad
  // file fails an attempt with InvalidArgument, which is not retried.
  TlsSettings tls;
  // When set and triggered: the wait between attempts ends at once, an
  // attempt in progress is cut, no other attempt is made, and the outcome is
  // a failure with `interrupted` set (parked by Send, put back to pending by
  // Replay). Not owned.
  const Interruption* interruption = nullptr;
  // Waits between attempts; tests replace it. By default a plain sleep, or
  // interruption->SleepFor with an interruption.
  std::function<void(Millis)> sleep;
  // 64 random bits for the jitter; tests replace it.
  std::function<std::uint64_t()> random;
  // Called after each attempt (one cut by the interruption included), before
  // the wait that may follow it; idemctl -v prints them.
  std::function<void(const AttemptReport&)> on_attempt;
};

class Client {
 public:
  explicit Client(ClientOptions options = {});

  // Sends with retries under one key (RequestKey: request.key, else the key
  // of its key header line; a NewKeyV4 when neither gives one): a kRetry
  // verdict waits max(backoff, Retry-After capped at max_delay) and tries
  // again while attempts remain. A final failure (kFail, or kRetry with no
  // attempt left) is parked in the DLQ when there is one, under that key
  // (the key header line dropped: the entry's key is sent in its place). A request
  // that ValidateRequest refuses, or any request when the options' policy
  // fails ValidatePolicy, is neither sent nor parked (Outcome::validation).
  // The key is sent as given: ValidateKey is the caller's to apply.
  Outcome Send(Request request);

  // Replays a parked entry under its original key (ClaimForReplay first; a
  // line of the key header in the entry's headers is dropped, as when it was
  // first sent): the same retries; the entry becomes replayed on success, else pending
  // again with the new error. Nothing is parked a second time. An entry that
  // ValidateRequest refuses (or without a key) is put back untouched and
  // the call fails (InvalidArgument, FailedPrecondition) without sending;
  // a policy that fails ValidatePolicy fails it (InvalidArgument) before the
  // entry is claimed. When the result cannot be recorded (the entry was
  // released meanwhile) the call fails (FailedPrecondition, "... was replayed
  // (...) but the result was not recorded: ..."), and the replay's outcome,
  // its response included, goes to `unrecorded` when given.
  StatusOr<Outcome> Replay(std::int64_t id, Outcome* unrecorded = nullptr);

 private:
  Outcome Run(const Request& request);

  ClientOptions options_;
};

}  // namespace idemgate::client
