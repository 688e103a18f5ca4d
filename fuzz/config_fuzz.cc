// The YAML config loader and validation (config::LoadString, what
// `idemgate check-config` and startup run on the operator's file), on any
// text. Checked: it returns (no crash, no escaping exception, no hang) with
// either an InvalidArgument whose message is self-contained, starting
// "<source>:" as documented in config/loader.h, or a Config that is
// normalised and passes Validate() again; and the same text gives the same
// answer twice (the loader keeps no state).

#include <string>
#include <string_view>

#include "config/loader.h"
#include "config/validate.h"
#include "fuzz_target.h"

namespace config = idemgate::config;

IDEMGATE_FUZZ_TARGET(config) {
  const std::string_view text = idemgate::fuzz::AsView(data, size);
  const auto loaded = config::LoadString(text, "fuzz.yaml");
  if (!loaded.ok()) {
    const idemgate::Status& status = loaded.status();
    FUZZ_CHECK(status.code() == idemgate::StatusCode::kInvalidArgument);
    FUZZ_CHECK(status.message().starts_with("fuzz.yaml:"));
    FUZZ_CHECK(status.message().size() > std::string_view("fuzz.yaml:").size());
    const auto again = config::LoadString(text, "fuzz.yaml");
    FUZZ_CHECK(!again.ok() && again.status().message() == status.message());
    return 0;
  }
  const config::Config& c = *loaded;
  FUZZ_CHECK(c.source == "fuzz.yaml");
  FUZZ_CHECK(config::Validate(c).ok());
  FUZZ_CHECK(!c.routes.empty());
  for (const config::Route& route : c.routes) {
    FUZZ_CHECK(route.line > 0);
    FUZZ_CHECK(c.upstreams.contains(route.upstream));
    FUZZ_CHECK(route.match.path.empty() != route.match.path_prefix.empty());
    for (const std::string& method : route.match.methods) {
      for (const char ch : method) FUZZ_CHECK(!(ch >= 'a' && ch <= 'z'));
    }
  }
  FUZZ_CHECK(config::LoadString(text, "fuzz.yaml").ok());
  return 0;
}
