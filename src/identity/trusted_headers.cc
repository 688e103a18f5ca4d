#include "identity/trusted_headers.h"

#include <optional>
#include <string>

#include "core/decision.h"

namespace idemgate::identity {

namespace {

// The single value of `name`, or why there is none.
StatusOr<std::string_view> OneValue(const std::vector<core::HeaderView>& headers, std::string_view name) {
  std::optional<std::string_view> found;
  for (const core::HeaderView& h : headers) {
    if (!core::HeaderNameEquals(h.name, name)) continue;
    if (found) return InvalidArgumentError("the " + std::string(name) + " header appears more than once");
    found = h.value;
  }
  if (!found || found->empty()) return InvalidArgumentError("the " + std::string(name) + " header is missing");
  if (found->size() > kMaxComponentLength) {
    return InvalidArgumentError("the " + std::string(name) + " header is longer than " +
                                std::to_string(kMaxComponentLength) + " characters");
  }
  for (unsigned char c : *found) {
    if (c <= 0x20 || c >= 0x7f) {
      return InvalidArgumentError("the " + std::string(name) + " header holds a character outside visible ASCII");
    }
  }
  return *found;
}

}  // namespace

StatusOr<core::Caller> CallerFromTrustedHeaders(const std::vector<core::HeaderView>& headers,
                                                const config::TrustedHeaders& names) {
  auto tenant = OneValue(headers, names.tenant);
  if (!tenant.ok()) return tenant.status();
  auto project = OneValue(headers, names.project);
  if (!project.ok()) return project.status();
  auto subject = OneValue(headers, names.subject);
  if (!subject.ok()) return subject.status();
  return core::Caller{std::string(*tenant), std::string(*project), std::string(*subject)};
}

}  // namespace idemgate::identity
