#pragma once

// One fuzz target per IDEMGATE_FUZZ_TARGET(name) { ... } block, written once
// and built two ways:
// - with IDEMGATE_LIBFUZZER (clang, `make fuzz`): the block is libFuzzer's
//   LLVMFuzzerTestOneInput, one binary per target (fuzz_<name>);
// - otherwise: the block registers itself under `name` in fuzz_replay, which
//   runs the committed corpus (fuzz/corpus/<name>) and a fixed-seed set of
//   mutations of it under the test presets (GCC, and ASan+UBSan in `asan`).
// A target returns 0; anything it finds wrong it reports by aborting
// (FUZZ_CHECK), so both drivers stop on it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#define FUZZ_CHECK(condition)                                                      \
  do {                                                                             \
    if (!(condition)) {                                                            \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed\n", __FILE__, __LINE__,   \
                   #condition);                                                    \
      std::abort();                                                                \
    }                                                                              \
  } while (false)

namespace idemgate::fuzz {

using TargetFn = int (*)(const std::uint8_t* data, std::size_t size);

// Adds a target to fuzz_replay's table; returns true so that it can
// initialise a static.
bool Register(const char* name, TargetFn fn);

inline std::string_view AsView(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace idemgate::fuzz

#if defined(IDEMGATE_LIBFUZZER)
#define IDEMGATE_FUZZ_TARGET(name) \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
#else
#define IDEMGATE_FUZZ_TARGET(name)                                                   \
  static int IdemgateFuzz_##name(const std::uint8_t* data, std::size_t size);       \
  [[maybe_unused]] static const bool idemgate_fuzz_registered_##name =               \
      ::idemgate::fuzz::Register(#name, &IdemgateFuzz_##name);                       \
  static int IdemgateFuzz_##name(const std::uint8_t* data, std::size_t size)
#endif
