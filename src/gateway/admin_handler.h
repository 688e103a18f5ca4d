#pragma once

#include "admin/admin_api.h"
#include "http/server.h"

// Serves admin::AdminApi (SPEC §9: /healthz, /readyz, /metrics,
// /admin/stats, /admin/keys/...) on the admin listener.
namespace idemgate::gateway {

class AdminHandler final : public http::Handler {
 public:
  // `api` must outlive the handler.
  explicit AdminHandler(const admin::AdminApi& api) : api_(api) {}
  http::Task<void> Handle(http::Exchange& exchange) override;

 private:
  const admin::AdminApi& api_;
};

}  // namespace idemgate::gateway
