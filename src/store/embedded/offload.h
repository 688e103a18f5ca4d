#pragma once

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <type_traits>
#include <utility>

#include "core/store.h"

namespace idemgate::store::embedded {

// Runs `fn` (a blocking call) on a thread of `pool`, then resumes the awaiting
// coroutine on the executor it was running on, with fn's result. The caller's
// thread is free while `fn` runs. `fn` must not throw.
//
// Why bind_executor: `co_await post(pool, use_awaitable)` does NOT move the
// coroutine; the completion handler's associated executor (the coroutine's own)
// wins, so the work would still run on the caller's thread. Binding the token
// to the pool's executor makes the pool thread resume the coroutine.
template <typename F>
core::Task<std::invoke_result_t<F&>> RunOnPool(boost::asio::thread_pool& pool, F fn) {
  namespace asio = boost::asio;
  auto caller = co_await asio::this_coro::executor;
  co_await asio::post(asio::bind_executor(pool.get_executor(), asio::use_awaitable));
  auto result = fn();
  co_await asio::post(asio::bind_executor(caller, asio::use_awaitable));
  co_return result;
}

}  // namespace idemgate::store::embedded
