#pragma once

#include <cstddef>

namespace idemgate {

// How deeply JSON request bodies may nest (objects and arrays), wherever the
// gateway parses them: the fingerprint's canonical form and webhook bodies
// (Stripe's id, a generic sender's id_pointer) take the same documents.
inline constexpr std::size_t kMaxJsonDepth = 64;

}  // namespace idemgate
