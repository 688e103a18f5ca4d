#pragma once

#include <boost/json/object.hpp>
#include <string_view>

#include "common/status.h"
#include "config/config.h"
#include "config/identity_component.h"
#include "core/scope.h"

// identity.mode jwt (SPEC §6): the caller a verified token names.
namespace idemgate::identity {

// True for 1..256 visible ASCII characters: a tenant, project or subject.
using config::IsIdentityComponent;

// The caller named by `claims` under `jwt.claims`: tenant, project and a
// typed subject "<type>:<id>". The type is the value of the
// `claims.subject_type` claim when that is configured and the token has it
// (it must be one of user, service, tenant_member, client); otherwise the
// sub's own type when it already starts with one of those and a colon;
// otherwise `subject_type`. A sub that starts with a type is never prefixed
// again: with a type claim it must start with the claim's type (kept as is),
// another type is refused. Each claim is a string or an integer of 1..256
// visible characters; InvalidArgument naming the claim otherwise. Pure.
StatusOr<core::Caller> CallerFromClaims(const boost::json::object& claims, const config::JwtIdentity& jwt);

}  // namespace idemgate::identity
