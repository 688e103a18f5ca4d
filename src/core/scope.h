#pragma once

#include <string>
#include <string_view>

namespace idemgate::core {

// How much of the caller goes into a stored key (SPEC §3.1). Core's own
// enum; the gateway maps config::Scope onto it.
enum class ScopeLevel { kSubject, kProject, kTenant, kGlobal };

// A component left out of the scope, or unknown.
inline constexpr std::string_view kAnyComponent = "_";
// The project of tenant-level routes and of platform routes.
inline constexpr std::string_view kTenantProject = "_tenant";
inline constexpr std::string_view kPlatformProject = "_platform";

// Who is calling, as identity resolved it. Empty components count as "_".
struct Caller {
  std::string tenant;
  std::string project;
  std::string subject;
};

// The stored key `t-{tenant}:{project}:{subject}:{route_id}:{raw}`.
// Components outside `level` become "_" (kProject drops the subject, kTenant
// the project and subject, kGlobal all three).
//
// Injective: in tenant, project and route_id the characters '%' and ':' are
// written as %25 and %3A; the subject is written as is (typed subjects such as
// "user:alice" keep their colon) since it is the only component that may hold
// a colon and the raw key never does (ParseIdempotencyKey refuses it). A
// tenant, project or subject whose value is "_" is written %5F, so that it is
// not read as a component left out, and a subject starting with '%' gets one
// more '%' before it (the subject "%5F" is written %%5F). So two different
// inputs, whatever the level, never give the same stored key. Pure;
// thread-safe.
std::string ScopedKey(ScopeLevel level, const Caller& caller, std::string_view route_id,
                      std::string_view raw_key);

}  // namespace idemgate::core
