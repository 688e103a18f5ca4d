#include "config/warnings.h"

#include <map>
#include <string_view>

#include "common/units.h"
#include "config/resolve.h"

namespace idemgate::config {

std::vector<std::string> ShutdownGraceWarnings(const Config& config) {
  // The routes that store keys through each upstream, in the routes' order.
  std::map<std::string_view, std::vector<std::string_view>> routes;
  for (const Route& r : config.routes) {
    const auto it = config.upstreams.find(r.upstream);
    if (!StoresKeys(r.idempotency) || it == config.upstreams.end()) continue;
    if (it->second.timeout > config.shutdown_grace) routes[it->first].push_back(r.id);
  }
  std::vector<std::string> warnings;
  for (const auto& [name, ids] : routes) {
    const std::string timeout = FormatDuration(config.upstreams.at(std::string(name)).timeout);
    std::string which = ids.size() == 1 ? "route" : "routes";
    for (std::size_t i = 0; i < ids.size(); ++i) which += (i == 0 ? " \"" : ", \"") + std::string(ids[i]) + "\"";
    which += ids.size() == 1 ? " stores" : " store";
    warnings.push_back("shutdown_grace " + FormatDuration(config.shutdown_grace) + " is below the timeout " +
                       timeout + " of upstream \"" + std::string(name) + "\", through which " + which +
                       " keys: on SIGTERM a request still running there when the grace ends has its key released "
                       "while the upstream may still run it, and a retry runs it again; set shutdown_grace to at "
                       "least " + timeout + " or lower the upstream's timeout");
  }
  return warnings;
}

}  // namespace idemgate::config
