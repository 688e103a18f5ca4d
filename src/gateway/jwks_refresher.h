#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/units.h"
#include "config/config.h"
#include "identity/jwt.h"

// identity.jwt.jwks_url (an extension of SPEC §6): the JWKS of an identity
// provider's jwks_uri, fetched over HTTP or HTTPS and kept fresh by a
// background thread.
//
// One JwksRefresher lives for the whole process (main owns it, like the
// stages) and outlives every config snapshot; main calls Configure with the
// identity.jwt settings at start and before each reload. The identity stage
// verifies tokens with the snapshot's own keys plus Keys(), and calls
// RequestRefresh when a token names a kid that none of them has (the provider
// rotated its keys since the last fetch).
//
// The keys are refetched every jwks_refresh and on request (at most once per
// on_demand_interval, so that tokens with made-up kids cannot make the
// gateway hammer the provider). A failed refetch, or a document without a
// usable key, keeps the last good keys and logs a warning.
namespace idemgate::gateway {

// Where and how the JWKS is fetched: the identity.jwt keys it comes from.
struct JwksSource {
  std::string url;
  std::string ca_file;
  Duration timeout{0};
  Duration refresh{0};
  bool operator==(const JwksSource&) const = default;

  static JwksSource FromConfig(const config::JwtIdentity& jwt) {
    return JwksSource{.url = jwt.jwks_url, .ca_file = jwt.jwks_ca_file, .timeout = jwt.jwks_timeout,
                      .refresh = jwt.jwks_refresh};
  }
};

// Fetches the JWKS text of `source` (bounded by source.timeout); an error
// with a short reason otherwise.
using JwksFetch = std::function<StatusOr<std::string>(const JwksSource& source)>;

// The JWKS fetch the gateway uses: one GET with client::SendOnce (TLS with
// source.ca_file or the system's trust store, the server always verified),
// within source.timeout. Only a 200 with a body of at most 1 MiB is a
// JWKS; redirects are not followed.
StatusOr<std::string> FetchJwksOverHttp(const JwksSource& source);

inline constexpr std::size_t kMaxJwksBytes = 1024 * 1024;

struct JwksRefresherOptions {
  // Empty: FetchJwksOverHttp; tests pass a fake. Called from the thread that
  // calls Configure and from the background thread, possibly at once: it
  // must be thread-safe.
  JwksFetch fetch;
  // The shortest jwks_refresh Configure accepts (config validation asks
  // for 10s; tests go lower here).
  Duration min_refresh = std::chrono::seconds(10);
  // RequestRefresh triggers at most one fetch per this interval.
  Duration on_demand_interval = std::chrono::seconds(30);
};

class JwksRefresher {
 public:
  explicit JwksRefresher(JwksRefresherOptions options = {});
  // Stops the background thread: promptly, or once an in-flight fetch ends
  // (bounded by jwks_timeout).
  ~JwksRefresher();
  JwksRefresher(const JwksRefresher&) = delete;
  JwksRefresher& operator=(const JwksRefresher&) = delete;

  // Applies the jwks_* settings of `jwt`. An empty jwks_url stops refreshing
  // and drops the keys. Settings equal to the running ones change nothing.
  // Otherwise the JWKS is fetched once, synchronously (bounded by
  // jwks_timeout): on failure nothing changes and the error (InvalidArgument
  // or Unavailable) starts "identity.jwt.jwks_url: " and gives the URL and
  // the reason; on success the keys are published and the periodic refresh
  // (re)starts from now. Configure and Revert: from one thread at a time.
  Status Configure(const config::JwtIdentity& jwt);

  // Undoes the last Configure that changed something (the settings and the
  // keys it replaced come back, without a fetch); nothing when there is none.
  // For a reload that fails after Configure succeeded.
  void Revert();

  // The current keys; null when no jwks_url is configured. Cheap (a mutex and
  // a shared_ptr copy), never does I/O; any thread.
  std::shared_ptr<const std::vector<identity::JwtKey>> Keys() const;

  // Asks the background thread for a fetch now, unless one was asked for
  // less than on_demand_interval ago (or no jwks_url is configured). Never
  // waits for the fetch; any thread.
  void RequestRefresh();

  // Fetches made so far (Configure's and the background thread's), for tests
  // and diagnostics.
  std::uint64_t fetch_count() const;

 private:
  using Clock = std::chrono::steady_clock;
  using Keyset = std::shared_ptr<const std::vector<identity::JwtKey>>;

  // The settings in force and their keys.
  struct State {
    std::optional<JwksSource> source;  // nullopt: no jwks_url
    Keyset keys;
  };

  // Fetches and parses `source`'s JWKS; an error with the reason.
  StatusOr<Keyset> Fetch(const JwksSource& source);
  // Makes `state` current (the one it replaces becomes previous_) and
  // reschedules the background thread. Holds mu_.
  void InstallLocked(State state);
  // The background thread: waits for the next due time, a request, a new
  // state or the stop, and fetches.
  void Run();

  const JwksRefresherOptions options_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  State current_;                               // guarded by mu_
  std::optional<State> previous_;               // for Revert; guarded by mu_
  std::uint64_t generation_ = 0;                // bumped by every Install; guarded by mu_
  Clock::time_point next_due_;                  // guarded by mu_
  bool refresh_requested_ = false;              // guarded by mu_
  std::optional<Clock::time_point> last_on_demand_;  // guarded by mu_
  bool stopping_ = false;                       // guarded by mu_
  std::uint64_t fetches_ = 0;                   // guarded by mu_
  std::thread thread_;  // started by the first Configure that installs a source
};

}  // namespace idemgate::gateway
