#include "core/scope.h"

namespace idemgate::core {

namespace {

void AppendEscaped(std::string* out, std::string_view component) {
  if (component.empty()) {
    out->append(kAnyComponent);
    return;
  }
  for (char c : component) {
    if (c == '%') {
      out->append("%25");
    } else if (c == ':') {
      out->append("%3A");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

std::string ScopedKey(ScopeLevel level, const Caller& caller, std::string_view route_id,
                      std::string_view raw_key) {
  const bool with_tenant = level != ScopeLevel::kGlobal;
  const bool with_project = level == ScopeLevel::kSubject || level == ScopeLevel::kProject;
  const bool with_subject = level == ScopeLevel::kSubject;

  std::string out;
  out.reserve(8 + caller.tenant.size() + caller.project.size() + caller.subject.size() +
              route_id.size() + raw_key.size());
  out.append("t-");
  AppendEscaped(&out, with_tenant ? std::string_view(caller.tenant) : kAnyComponent);
  out.push_back(':');
  AppendEscaped(&out, with_project ? std::string_view(caller.project) : kAnyComponent);
  out.push_back(':');
  if (with_subject && !caller.subject.empty()) {
    out.append(caller.subject);
  } else {
    out.append(kAnyComponent);
  }
  out.push_back(':');
  AppendEscaped(&out, route_id);
  out.push_back(':');
  out.append(raw_key);
  return out;
}

}  // namespace idemgate::core
