#include "client/client.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/http/status.hpp>
#include <cerrno>
#include <exception>
#include <random>
#include <thread>

#include "common/ascii.h"

// Client: the retry loop under one key, parking in and replaying from the DLQ.
namespace idemgate::client {

namespace {

// 64 random bits for the jitter: OpenSSL, else the system's random device,
// else a clock reading (jitter needs spread, not secrecy).
std::uint64_t RandomU64() {
  std::uint64_t value = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&value), sizeof value) == 1) return value;
  try {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  } catch (...) {
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
}

// "503 Service Unavailable", plus " (code)" when the body is a problem with a code.
std::string StatusText(int status, std::string_view problem_code) {
  std::string text = std::to_string(status);
  if (status >= 0 && status <= 999) {
    const auto reason = boost::beast::http::obsolete_reason(
        boost::beast::http::int_to_status(static_cast<unsigned>(status)));
    if (!reason.empty() && reason != "<unknown-status>") text += " " + std::string(reason);
  }
  if (!problem_code.empty()) text += " (" + std::string(problem_code) + ")";
  return text;
}

// Transport failures that another attempt may cure; anything else from
// SendOnce (a bad URL, an oversized response) would fail the same way again.
bool IsTransientTransportError(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded;
}

// Drops the lines of the key header from `request.headers`: the key (set) is sent in their place.
void DropKeyHeaderLines(Request& request) {
  std::erase_if(request.headers,
                [&](const Header& header) { return EqualsIgnoreCaseAscii(header.first, request.key_header); });
}

// The status of the last attempt's response, 0 without one.
int LastStatus(const Outcome& outcome) { return outcome.response ? outcome.response->status : 0; }

}  // namespace

// A non-blocking pipe whose read end becomes readable on Trigger.
Interruption::Interruption() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
    read_fd_ = fds[0];
    write_fd_ = fds[1];
  }
}

Interruption::~Interruption() {
  if (read_fd_ >= 0) ::close(read_fd_);
  if (write_fd_ >= 0) ::close(write_fd_);
}

// The byte is never read: the pipe stays readable, as the flag stays set.
void Interruption::Trigger() noexcept {
  const int saved_errno = errno;  // a signal handler must leave errno alone
  triggered_.store(true, std::memory_order_release);
  if (write_fd_ >= 0) (void)!::write(write_fd_, "x", 1);
  errno = saved_errno;
}

// poll(2) on the pipe, in steps that fit its int milliseconds, until the
// wait is over or the pipe is readable; without a pipe, short sleeps.
bool Interruption::SleepFor(Millis wait) const {
  const auto deadline = std::chrono::steady_clock::now() + std::min(wait, Millis{std::chrono::hours(24 * 366)});
  while (!triggered()) {
    const auto left = std::chrono::ceil<Millis>(deadline - std::chrono::steady_clock::now());
    if (left <= Millis{0}) return false;
    const int step = static_cast<int>(std::min<std::int64_t>(left.count(), read_fd_ >= 0 ? 1'000'000 : 20));
    if (read_fd_ >= 0) {
      pollfd p{.fd = read_fd_, .events = POLLIN, .revents = 0};
      (void)::poll(&p, 1, step);  // EINTR: the loop looks again
    } else {
      std::this_thread::sleep_for(Millis{step});
    }
  }
  return true;
}

// Fills in the real sleep and random source where the options leave them empty.
Client::Client(ClientOptions options) : options_(std::move(options)) {
  if (!options_.sleep) {
    if (const Interruption* interruption = options_.interruption) {
      options_.sleep = [interruption](Millis wait) { interruption->SleepFor(wait); };
    } else {
      options_.sleep = [](Millis wait) { std::this_thread::sleep_for(wait); };
    }
  }
  if (!options_.random) options_.random = RandomU64;
}

// The attempts loop for a request that already has its key; never throws.
Outcome Client::Run(const Request& request) {
  Outcome out;
  out.key = request.key;
  const RetryPolicy& policy = options_.policy;
  const int max_attempts = std::max(1, policy.max_attempts);
  const Interruption* interruption = options_.interruption;
  try {
    for (int attempt = 1; attempt <= max_attempts; ++attempt) {
      if (interruption != nullptr && interruption->triggered()) {
        out.interrupted = true;
        out.error = attempt == 1 ? "interrupted before the first attempt"
                                 : "interrupted after " + std::to_string(attempt - 1) +
                                       (attempt == 2 ? " attempt" : " attempts") + " (the last: " + out.error + ")";
        return out;
      }
      out.attempts = attempt;
      auto result = SendOnce(request, policy.timeout, options_.tls, interruption);
      if (!result.ok() && result.status().code() == StatusCode::kAborted && interruption != nullptr &&
          interruption->triggered()) {
        out.interrupted = true;
        out.response.reset();
        out.error = result.status().message() + " (attempt " + std::to_string(attempt) +
                    "; the request may have reached the server)";
        if (options_.on_attempt) options_.on_attempt(AttemptReport{.attempt = attempt, .summary = out.error});
        return out;
      }
      Verdict verdict = Verdict::kRetry;
      std::optional<Millis> retry_after;
      if (result.ok()) {
        const std::string code = result->ProblemCode();
        verdict = Classify(result->status, code);
        if (verdict != Verdict::kSuccess) out.error = StatusText(result->status, code);
        if (const auto value = result->Header("Retry-After")) {
          retry_after = ParseRetryAfter(*value, std::chrono::system_clock::now());
        }
        out.response = std::move(*result);
      } else {
        out.response.reset();
        out.error = result.status().message();
        verdict = IsTransientTransportError(result.status()) ? Classify(0, "") : Verdict::kFail;
      }
      AttemptReport report{.attempt = attempt,
                           .ok = verdict == Verdict::kSuccess,
                           .status = out.response ? out.response->status : 0,
                           .summary = out.response && verdict == Verdict::kSuccess
                                          ? StatusText(out.response->status, "")
                                          : out.error};
      if (verdict == Verdict::kSuccess) {
        out.ok = true;
        out.error.clear();
        if (options_.on_attempt) options_.on_attempt(report);
        return out;
      }
      if (verdict == Verdict::kFail || attempt == max_attempts) {
        if (options_.on_attempt) options_.on_attempt(report);
        return out;
      }
      Millis wait = BackoffDelay(policy, attempt + 1, options_.random());
      if (retry_after) wait = std::max(wait, std::min(*retry_after, std::max(policy.max_delay, Millis{0})));
      report.wait = wait;
      if (options_.on_attempt) options_.on_attempt(report);
      options_.sleep(wait);
    }
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = std::string("client error: ") + e.what();
  } catch (...) {
    out.ok = false;
    out.error = "client error";
  }
  return out;
}

// Sends under one key and parks a final failure; a request no attempt could
// send is refused before the first one and not parked (a replay would fail
// the same way).
Outcome Client::Send(Request request) {
  Outcome out;
  try {
    Status valid = ValidatePolicy(options_.policy);
    if (valid.ok()) {
      // A line of the key header gives the key as request.key does: one
      // dropped for a new key would run the action again on every Send.
      auto key = RequestKey(request);
      if (key.ok()) {
        request.key = key->empty() ? NewKeyV4() : std::move(*key);
        DropKeyHeaderLines(request);
        valid = ValidateRequest(request);
      } else {
        valid = key.status();
      }
    }
    if (!valid.ok()) {
      out.key = request.key;
      out.error = valid.message();
      out.validation = std::move(valid);
      return out;
    }
    out = Run(request);
    if (!out.ok && options_.dlq != nullptr) {
      auto id = options_.dlq->Park(request, out.error, out.attempts, LastStatus(out));
      if (id.ok()) {
        out.dead_letter_id = *id;
      } else {
        out.error += "; not parked: " + id.status().ToString();
      }
    }
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = std::string("client error: ") + e.what();
  }
  return out;
}

// Claims the entry, runs the loop under its original request and key, and
// records the result on the entry.
StatusOr<Outcome> Client::Replay(std::int64_t id, Outcome* unrecorded) {
  try {
    if (options_.dlq == nullptr) return FailedPreconditionError("the client has no dead-letter queue");
    if (Status valid = ValidatePolicy(options_.policy); !valid.ok()) return valid;
    // The longest this replay can run: every attempt to its timeout and the
    // longest wait between them, and a margin (within ValidatePolicy's
    // bounds, a few hundred years at most: no overflow). Until then a claim
    // made on another host is not released without --force.
    const RetryPolicy& p = options_.policy;
    const int attempts = p.max_attempts;
    const Millis longest = p.timeout * attempts + p.max_delay * (attempts - 1) + Millis{5000};
    auto entry = options_.dlq->ClaimForReplay(id, longest);
    if (!entry.ok()) return entry.status();
    if (entry->request.key.empty()) {
      // Without its key a replay could execute twice; put the entry back untouched.
      const std::string error = "dead letter " + std::to_string(id) + " has no key";
      Status s = options_.dlq->FinishReplay(id, false, entry->error, 0, entry->last_status);
      return FailedPreconditionError(s.ok() ? error : error + "; " + s.ToString());
    }
    // Never sent: SendOnce (and idemctl) sent the entry's key in place of such a line.
    DropKeyHeaderLines(entry->request);
    if (Status valid = ValidateRequest(entry->request); !valid.ok()) {
      // It could never be sent (it was parked before Send checked requests):
      // put it back untouched, for `discard`.
      const std::string error = "dead letter " + std::to_string(id) + " can never be sent: " + valid.message();
      Status s = options_.dlq->FinishReplay(id, false, entry->error, 0, entry->last_status);
      return Status(valid.code(), s.ok() ? error : error + "; " + s.ToString());
    }
    Outcome out = Run(entry->request);
    out.dead_letter_id = id;
    // Without an attempt (interrupted before the first) the last status is still the entry's.
    const Status finished = options_.dlq->FinishReplay(id, out.ok, out.error, out.attempts,
                                                       out.attempts > 0 ? LastStatus(out) : entry->last_status);
    if (!finished.ok()) {
      Status s(finished.code(), "dead letter " + std::to_string(id) + " was replayed (" +
                                    (out.ok ? std::string("ok") : out.error) +
                                    ") but the result was not recorded: " + finished.message());
      if (unrecorded != nullptr) *unrecorded = std::move(out);
      return s;
    }
    return out;
  } catch (const std::exception& e) {
    return InternalError(std::string("replay failed: ") + e.what());
  }
}

}  // namespace idemgate::client
