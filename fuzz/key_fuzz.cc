// Idempotency-Key parsing (SPEC §3). The first byte picks the rules and how
// many header lines the request carried; the rest, split at '\n', is the
// lines. Checked: an accepted key obeys the rules, and both of its spellings
// (the sf-string the gateway forwards, and the bare token for a key of the
// base charset)
// parse back to the same key.

#include <string>
#include <string_view>
#include <vector>

#include "core/key.h"
#include "fuzz_target.h"

namespace core = idemgate::core;

IDEMGATE_FUZZ_TARGET(key) {
  if (size == 0) return 0;
  const std::uint8_t control = data[0];
  std::string_view rest = idemgate::fuzz::AsView(data + 1, size - 1);

  core::KeyRules rules;
  if (control & 0x01) rules.max_length = 8;
  if (control & 0x02) rules.extra_charset = "\"\\ ,;=/+:";  // a colon here is still refused

  std::vector<std::string_view> lines;
  const std::size_t max_lines = 1 + ((control >> 2) & 0x03);
  while (lines.size() + 1 < max_lines) {
    const std::size_t end = rest.find('\n');
    if (end == std::string_view::npos) break;
    lines.push_back(rest.substr(0, end));
    rest.remove_prefix(end + 1);
  }
  if (!(control & 0x10)) lines.push_back(rest);  // else: no line at all when max_lines is 1

  const core::ParsedKey parsed = core::ParseIdempotencyKey(lines, rules);
  FUZZ_CHECK(!core::KeyErrorReason(parsed.error).empty() == !parsed.ok());
  if (lines.empty()) FUZZ_CHECK(parsed.error == core::KeyError::kMissing);
  if (lines.size() > 1) FUZZ_CHECK(parsed.error == core::KeyError::kDuplicate);
  if (!parsed.ok()) return 0;

  FUZZ_CHECK(core::ValidateRawKey(parsed.key, rules) == core::KeyError::kNone);
  FUZZ_CHECK(!parsed.key.empty() && parsed.key.size() <= rules.max_length);
  FUZZ_CHECK(parsed.key.find(':') == std::string::npos);
  FUZZ_CHECK(!parsed.key.starts_with(core::kReservedKeyPrefix));

  const std::string sf = core::SerializeKeyAsSfString(parsed.key);
  const core::ParsedKey again = core::ParseIdempotencyKey({sf}, rules);
  FUZZ_CHECK(again.ok() && again.sf_string && again.key == parsed.key);

  // Keys of the base charset may also be sent bare, as Stripe's clients do.
  if (core::ValidateRawKey(parsed.key, core::KeyRules{.max_length = rules.max_length}) ==
      core::KeyError::kNone) {
    const core::ParsedKey bare = core::ParseIdempotencyKey({parsed.key}, rules);
    FUZZ_CHECK(bare.ok() && !bare.sf_string && bare.key == parsed.key);
  }
  return 0;
}
