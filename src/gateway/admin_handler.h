#pragma once

#include "admin/admin_api.h"
#include "admin/gateway_metrics.h"
#include "http/server.h"

// Serves admin::AdminApi (SPEC §9: /healthz, /readyz, /metrics,
// /admin/stats, /admin/keys/...) on the admin listener.
namespace idemgate::gateway {

class AdminHandler final : public http::Handler {
 public:
  // `api` and `metrics` (may be null) must outlive the handler. Connections
  // refused and failed TLS handshakes on the admin listener are counted in
  // `metrics` under listener="admin".
  explicit AdminHandler(const admin::AdminApi& api, admin::GatewayMetrics* metrics = nullptr)
      : api_(api), metrics_(metrics) {}
  http::Task<void> Handle(http::Exchange& exchange) override;
  void ConnectionRefused() override;
  void TlsHandshakeFailed() override;

 private:
  const admin::AdminApi& api_;
  admin::GatewayMetrics* metrics_;
};

}  // namespace idemgate::gateway
