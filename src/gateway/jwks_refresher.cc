#include "gateway/jwks_refresher.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "client/client.h"
#include "common/log.h"
#include "common/text.h"

namespace idemgate::gateway {

namespace {

// Bounds that keep steady_clock arithmetic far from overflowing whatever a
// config says (a duration may be up to 2^63 ms).
constexpr Duration kLongestWait = std::chrono::hours(24 * 365);
constexpr Duration kLongestTimeout = std::chrono::hours(24);

}  // namespace

StatusOr<std::string> FetchJwksOverHttp(const JwksSource& source) {
  client::Request request;
  request.method = "GET";
  request.url = source.url;
  request.headers.emplace_back("Accept", "application/json");
  request.max_response_bytes = kMaxJwksBytes;  // a larger answer stops being read there
  client::TlsSettings tls;
  tls.ca_file = source.ca_file;
  const client::Millis timeout = std::clamp(source.timeout, Duration(1), kLongestTimeout);
  StatusOr<client::Response> response = client::SendOnce(request, timeout, tls);
  if (!response.ok()) return response.status();
  if (response->status != 200) {
    return UnavailableError("the server answered " + std::to_string(response->status) + " instead of 200");
  }
  if (response->body.size() > kMaxJwksBytes) return InvalidArgumentError("the JWKS is larger than 1 MiB");
  return std::move(response->body);
}

JwksRefresher::JwksRefresher(JwksRefresherOptions options) : options_(std::move(options)) {}

JwksRefresher::~JwksRefresher() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status JwksRefresher::Configure(const config::JwtIdentity& jwt) {
  std::optional<JwksSource> wanted;
  if (!jwt.jwks_url.empty()) wanted = JwksSource::FromConfig(jwt);
  {
    std::lock_guard lock(mu_);
    previous_.reset();  // a Revert after this call undoes this call, or nothing
    if (current_.source == wanted) return Status::Ok();
    if (!wanted) {
      InstallLocked(State{});
      return Status::Ok();
    }
  }
  if (wanted->refresh < options_.min_refresh) {
    return InvalidArgumentError("identity.jwt.jwks_refresh: must be at least " + FormatDuration(options_.min_refresh));
  }
  if (wanted->timeout <= Duration::zero()) {
    return InvalidArgumentError("identity.jwt.jwks_timeout: must be greater than 0");
  }
  StatusOr<Keyset> keys = Fetch(*wanted);
  if (!keys.ok()) {
    return Status(keys.status().code(), "identity.jwt.jwks_url: " + RedactUrl(wanted->url) + ": " + keys.status().message());
  }
  {
    std::lock_guard lock(mu_);
    InstallLocked(State{.source = std::move(wanted), .keys = std::move(*keys)});
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void JwksRefresher::Revert() {
  std::lock_guard lock(mu_);
  if (!previous_) return;
  State back = std::move(*previous_);
  InstallLocked(std::move(back));
  previous_.reset();
}

std::shared_ptr<const std::vector<identity::JwtKey>> JwksRefresher::Keys() const {
  std::lock_guard lock(mu_);
  return current_.keys;
}

void JwksRefresher::RequestRefresh() {
  std::lock_guard lock(mu_);
  if (!current_.source || stopping_) return;
  const Clock::time_point now = Clock::now();
  if (last_on_demand_ && now - *last_on_demand_ < options_.on_demand_interval) return;
  last_on_demand_ = now;
  refresh_requested_ = true;
  wake_.notify_all();
}

std::uint64_t JwksRefresher::fetch_count() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

StatusOr<JwksRefresher::Keyset> JwksRefresher::Fetch(const JwksSource& source) {
  {
    std::lock_guard lock(mu_);
    ++fetches_;
  }
  StatusOr<std::string> text = InternalError("the JWKS fetch failed");
  try {
    text = options_.fetch ? options_.fetch(source) : FetchJwksOverHttp(source);
  } catch (const std::exception& e) {
    text = InternalError(std::string("the JWKS fetch failed: ") + e.what());
  }
  if (!text.ok()) return text.status();
  StatusOr<std::vector<identity::JwtKey>> keys = identity::JwtVerifier::KeysFromJwks(*text);
  if (!keys.ok()) return keys.status();
  return Keyset(std::make_shared<std::vector<identity::JwtKey>>(std::move(*keys)));
}

void JwksRefresher::InstallLocked(State state) {
  previous_ = std::move(current_);
  current_ = std::move(state);
  ++generation_;
  refresh_requested_ = false;
  if (current_.source) next_due_ = Clock::now() + std::min(current_.source->refresh, kLongestWait);
  wake_.notify_all();
}

void JwksRefresher::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (!current_.source) {
      wake_.wait(lock, [this] { return stopping_ || current_.source.has_value(); });
      continue;
    }
    const std::uint64_t generation = generation_;
    // Returns on the stop, a request or a new state; or, with all three
    // false, once the refresh is due.
    (void)wake_.wait_until(lock, next_due_,
                           [&] { return stopping_ || refresh_requested_ || generation_ != generation; });
    if (stopping_) break;
    if (generation_ != generation) continue;  // rescheduled by Configure or Revert
    refresh_requested_ = false;
    const JwksSource source = *current_.source;
    lock.unlock();
    StatusOr<Keyset> keys = Fetch(source);
    if (keys.ok()) {
      LogDebug("JWKS refreshed", {{"url", RedactUrl(source.url)}, {"keys", static_cast<std::uint64_t>((*keys)->size())}});
    } else {
      LogWarn("JWKS refresh failed; keeping the last keys",
              {{"url", RedactUrl(source.url)}, {"error", keys.status().message()}});
    }
    lock.lock();
    if (generation_ != generation) continue;  // the settings changed meanwhile: this fetch is stale
    if (keys.ok()) current_.keys = std::move(*keys);
    next_due_ = Clock::now() + std::min(source.refresh, kLongestWait);
  }
}

}  // namespace idemgate::gateway
