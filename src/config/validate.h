#pragma once

#include "common/status.h"
#include "config/config.h"

namespace idemgate::config {

class LineIndex;

// Checks a complete Config against SPEC §11: ranges (timeouts, sizes and
// leases > 0), addresses, header names, methods, JSON Pointers, and the
// cross-field rules (at least one route, unique route ids, every route names a
// defined upstream, exactly one of match.path_prefix and match.path, webhook
// routes name a provider, redis needs an address, ...). Expects the loader's
// normalisation: methods upper-case, fingerprint header names lower-case,
// upstream host/port filled (see ParseUpstreamUrl).
//
// Returns the first problem as InvalidArgument with the message
// "source:line: key: what", where source is config.source and line comes from
// Route::line for keys under a route (parts that are unknown are left out).
// The loader calls this with exact key lines; call it on configs built in code.
Status Validate(const Config& config);

// As Validate, taking key lines from `lines` (internal to the loader).
Status ValidateWithLines(const Config& config, const LineIndex& lines);

// Checks the endpoints read from webhooks.file `source` on their own (keys
// "endpoints[i]...", lines from `lines`); internal to the loader. Validate
// then compares their ids with the inline endpoints'.
Status ValidateWebhookEndpoints(const std::vector<WebhookEndpoint>& endpoints, const std::string& source,
                                const LineIndex& lines);

}  // namespace idemgate::config
