#pragma once

#include <string>
#include <vector>

#include "config/config.h"

// Settings that load and run but put stored keys at risk. The gateway logs
// each line as a warning at start and on every reload, and check-config
// prints each as a warning; none stops anything.
namespace idemgate::config {

// One line per upstream whose timeout is longer than shutdown_grace and that
// a route storing keys (policy required, optional or webhook, dedup: gateway)
// forwards to, in upstream name order; empty when none. On SIGTERM a request
// still running there when the grace ends has its key released while the
// upstream may still run it, so a retry runs the write again. Pure.
std::vector<std::string> ShutdownGraceWarnings(const Config& config);

}  // namespace idemgate::config
