#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "core/store.h"

// Helpers to drive coroutines of the engine and stores on an io_context.
namespace idemgate::core::testing {

// Awaits `task` and puts its result in `*out` (results need not be default
// constructible, unlike co_spawn's completion values).
template <typename T>
Task<void> StoreResult(Task<T> task, std::optional<T>* out) {
  out->emplace(co_await std::move(task));
}

// Spawns `task`; its result lands in `*out` when it finishes.
template <typename T>
void Spawn(boost::asio::io_context& ctx, Task<T> task, std::optional<T>* out) {
  boost::asio::co_spawn(ctx, StoreResult(std::move(task), out), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
}

// Runs `task` on `ctx` until it and everything else queued has finished.
template <typename T>
T RunTask(boost::asio::io_context& ctx, Task<T> task) {
  std::optional<T> out;
  Spawn(ctx, std::move(task), &out);
  ctx.restart();
  ctx.run();
  return std::move(*out);
}

// Runs ready handlers of `ctx` until `done` holds or `timeout` passes (real
// time). Returns the last value of `done`.
inline bool PollUntil(boost::asio::io_context& ctx, const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    ctx.restart();
    if (ctx.poll() == 0) std::this_thread::yield();
  }
  return true;
}

}  // namespace idemgate::core::testing
