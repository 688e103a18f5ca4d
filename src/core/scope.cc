#include "core/scope.h"

namespace idemgate::core {

namespace {

// A component a caller has, as the key writes it: '%' and ':' as %25 and
// %3A, and the value "_" as %5F, since "_" stands for a component left out
// (or empty).
void AppendEscaped(std::string* out, std::string_view component) {
  if (component.empty()) {
    out->append(kAnyComponent);
    return;
  }
  if (component == kAnyComponent) {
    out->append("%5F");
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

// The subject is written as it is (a typed one keeps its colon), except the
// value "_", written %5F, and a subject starting with '%', which gets one
// more '%' before it, so that no subject is written as another's or as "_".
void AppendSubject(std::string* out, std::string_view subject) {
  if (subject.empty()) {
    out->append(kAnyComponent);
  } else if (subject == kAnyComponent) {
    out->append("%5F");
  } else {
    if (subject.front() == '%') out->push_back('%');
    out->append(subject);
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
  if (with_tenant) {
    AppendEscaped(&out, caller.tenant);
  } else {
    out.append(kAnyComponent);
  }
  out.push_back(':');
  if (with_project) {
    AppendEscaped(&out, caller.project);
  } else {
    out.append(kAnyComponent);
  }
  out.push_back(':');
  if (with_subject) {
    AppendSubject(&out, caller.subject);
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
