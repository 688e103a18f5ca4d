#pragma once

// Helpers shared by the store contract suite and store-specific tests: run a
// store coroutine to completion, and build records as the engine does.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/units.h"
#include "core/record.h"
#include "core/store.h"

namespace idemgate::contract {

using namespace std::chrono_literals;

// Runs `task` to completion on `io` (which must not be running elsewhere) and
// returns its result. Exceptions escaping the task are rethrown.
template <typename T>
T RunOn(boost::asio::io_context& io, core::Task<T> task) {
  std::optional<T> out;
  boost::asio::co_spawn(
      io, [&]() -> core::Task<void> { out.emplace(co_await std::move(task)); },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.restart();
  io.run();
  if (!out) throw std::logic_error("store operation did not complete");
  return std::move(*out);
}

inline void RunOn(boost::asio::io_context& io, core::Task<void> task) {
  bool done = false;
  boost::asio::co_spawn(
      io,
      [&]() -> core::Task<void> {
        co_await std::move(task);
        done = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.restart();
  io.run();
  if (!done) throw std::logic_error("store operation did not complete");
}

// Names instantiations after `Fixture::kName` (a const char*), for
// INSTANTIATE_TYPED_TEST_SUITE_P's fourth argument.
struct FixtureNames {
  template <typename Fixture>
  static std::string GetName(int) {
    return Fixture::kName;
  }
};

// A reservation as the engine makes it.
inline core::Record Reservation(std::string owner, std::string fingerprint, UnixMillis now,
                                Duration lease = 60s) {
  core::Record r;
  r.state = core::RecordState::kInFlight;
  r.fingerprint = std::move(fingerprint);
  r.owner = std::move(owner);
  r.operation_id = "op-" + r.owner;
  r.created_ms = now;
  r.lease_expires_ms = now + lease.count();
  return r;
}

// `reservation` completed with a response; `retention` 0 keeps it forever.
inline core::Record Completion(core::Record reservation, UnixMillis now, Duration retention,
                               int status = 201, std::string body = "{\"id\":42}") {
  core::Record r = std::move(reservation);
  r.state = core::RecordState::kCompleted;
  r.lease_expires_ms = 0;
  r.expires_ms = retention.count() == 0 ? 0 : now + retention.count();
  r.response.status = status;
  r.response.headers = {{"Content-Type", "application/json"},
                        {"Set-Cookie", "a=1"},
                        {"Set-Cookie", "b=2"},
                        {"Location", "/orders/42"}};
  r.response.body = std::move(body);
  return r;
}

// 32 bytes, like a SHA-256 digest; `tag` picks one of many.
inline std::string Fingerprint(int tag) {
  std::string fp(32, '\0');
  std::mt19937 rng(static_cast<std::uint32_t>(tag) * 2654435761u + 7);
  for (auto& c : fp) c = static_cast<char>(rng());
  return fp;
}

}  // namespace idemgate::contract
