#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config.h"
#include "gateway/admission.h"
#include "gateway/hooks.h"
#include "gateway/identity_stage.h"
#include "gateway/route_table.h"
#include "gateway/webhook_stage.h"
#include "http/server.h"
#include "http/upstream_pool.h"

namespace idemgate::admin {
class GatewayMetrics;
}

// The gateway's request handler: route table + per-request pipeline
// (hooks.h) + proxy, behind an immutable snapshot of the config that a
// reload swaps atomically.
namespace idemgate::gateway {

// One immutable view of the config: the routes and what the upstream pools
// are made from. Shared read-only by every worker.
struct Snapshot {
  std::shared_ptr<const config::Config> config;
  RouteTable routes;
  // Per upstream (RouteTable::upstreams() order): the pool settings of one
  // worker, with max_connections already divided among the workers.
  std::vector<http::UpstreamTarget> upstreams;
  // The webhook endpoints with their secrets read (SPEC §7).
  std::shared_ptr<const WebhookEndpoints> webhooks;
  // The JWT keys or API keys of identity.mode jwt / api_key (SPEC §6).
  std::shared_ptr<const IdentityCredentials> identity;
  std::uint64_t version = 0;
};

struct GatewayOptions {
  // Worker threads of the server this gateway serves (Server::worker_count()).
  std::size_t workers = 1;
  // Optional; must outlive the gateway.
  admin::GatewayMetrics* metrics = nullptr;
  IdentityHook* identity = nullptr;
  WebhookHook* webhook = nullptr;
  IdempotencyHook* idempotency = nullptr;
  // Where secrets named by secret_env are read (tests replace it).
  EnvLookup env = DefaultEnvLookup;
};

// The limits the server applies, from config `limits`.
http::Limits LimitsFromConfig(const config::Config& config);
// The pool settings of one worker for `upstream` (max_connections divided
// among `workers`, rounded up, at least 1).
http::UpstreamTarget UpstreamTargetFromConfig(const config::Upstream& upstream, std::size_t workers);
// The TLS context of an `https` upstream (its ca_file, cert_file, key_file
// read now); errors name `upstreams.NAME.tls`.
StatusOr<std::shared_ptr<const http::TlsContext>> UpstreamTlsFromConfig(const std::string& name,
                                                                        const config::Upstream& upstream);

class Gateway final : public http::Handler {
 public:
  // Builds the first snapshot; fails on a config the route table refuses or
  // a secret or key file (webhooks, identity) that cannot be read.
  static StatusOr<std::unique_ptr<Gateway>> Create(const config::Config& config, GatewayOptions options);
  ~Gateway() override;

  // Swaps in a new snapshot built from `config`. Requests already running
  // finish under the old one; each worker picks the new one up at its next
  // request. Upstream pools whose settings did not change are kept (with
  // their idle connections). Listen address, workers and store settings are
  // not reloadable (they need a restart). Thread-safe.
  Status Reload(const config::Config& config);

  // The pipeline. Runs on the exchange's worker.
  Task<void> Handle(http::Exchange& exchange) override;
  // A request the server refused before routing: one request log line
  // (route null, `outcome` the refusal's reason) and
  // idemgate_requests_refused_total; a header timeout is counted and
  // logged at debug only (it sent no answer, and a slow-loris flood must
  // not flood the log).
  void Refused(const http::RefusedRequest& refused) override;
  // Counted in idemgate_connections_refused_total.
  void ConnectionRefused() override;
  void TlsHandshakeFailed() override;

  std::shared_ptr<const Snapshot> snapshot() const;

  // Destroys every upstream pool. Call after the server's workers stopped
  // and before they are destroyed (the pools' sockets belong to them).
  void ClosePools();

 private:
  struct WorkerView;
  struct WorkerSlot;

  explicit Gateway(GatewayOptions options);
  StatusOr<std::shared_ptr<const Snapshot>> BuildSnapshot(const config::Config& config);
  std::shared_ptr<WorkerView> ViewFor(http::Worker& worker);

  GatewayOptions options_;
  AdmissionRegistry admission_;
  mutable std::mutex mu_;
  std::shared_ptr<const Snapshot> current_;  // guarded by mu_
  std::atomic<std::uint64_t> version_{0};
  std::vector<std::unique_ptr<WorkerSlot>> slots_;  // one per worker; touched by that worker only
};

}  // namespace idemgate::gateway
