#include "config/reload_changes.h"

#include <map>
#include <string_view>

#include "config/names.h"
#include "config/resolve.h"

namespace idemgate::config {
namespace {

std::string Quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

}  // namespace

std::vector<std::string> StoredKeyChanges(const Config& before, const Config& after) {
  std::vector<std::string> changes;
  std::map<std::string_view, const Route*> now;
  for (const Route& r : after.routes) now.emplace(r.id, &r);
  for (const Route& was : before.routes) {
    if (!StoresKeys(was.idempotency)) continue;
    const std::string route = "route " + Quoted(was.id);
    const auto it = now.find(was.id);
    if (it == now.end()) {
      changes.push_back(route + " is gone: the requests stored under it are no longer replayed, and a route "
                                "under a new id starts with no stored keys");
      continue;
    }
    const Idempotency& idem = it->second->idempotency;
    if (!StoresKeys(idem)) {
      changes.push_back(route + " no longer deduplicates (policy " + std::string(Name(idem.policy)) +
                        (idem.dedup == DedupMode::kUpstream ? ", dedup upstream" : "") +
                        "): the requests stored under it are no longer replayed");
      continue;
    }
    const Scope scope_was = EffectiveScope(was.idempotency, before.identity);
    const Scope scope_now = EffectiveScope(idem, after.identity);
    if (scope_was != scope_now) {
      changes.push_back(route + ": keys are now scoped by " + std::string(Name(scope_now)) + " instead of " +
                        std::string(Name(scope_was)) +
                        ": the requests stored before are no longer found, and their retries run again");
    }
    const Fingerprint& f_was = was.idempotency.fingerprint;
    const Fingerprint& f_now = idem.fingerprint;
    if (f_was.headers != f_now.headers || f_was.json != f_now.json || f_was.json_fields != f_now.json_fields) {
      changes.push_back(route + ": idempotency.fingerprint covers other parts of a request now: retries of "
                                "requests stored before get 422 key-reused instead of their stored response");
    }
  }
  std::map<std::string_view, const WebhookEndpoint*> endpoints;
  for (const WebhookEndpoint& w : after.webhooks) endpoints.emplace(w.id, &w);
  for (const WebhookEndpoint& was : before.webhooks) {
    const std::string endpoint = "webhook endpoint " + Quoted(was.id);
    const auto it = endpoints.find(was.id);
    if (it == endpoints.end()) {
      changes.push_back(endpoint + " is gone: its sender's deliveries get 404, and its stored events are no "
                                   "longer replayed");
    } else if (it->second->tenant != was.tenant || it->second->project != was.project) {
      changes.push_back(endpoint + " moves from " + was.tenant + "/" + was.project + " to " + it->second->tenant +
                        "/" + it->second->project +
                        ": redeliveries of events stored before are no longer found and run again");
    }
  }
  return changes;
}

}  // namespace idemgate::config
