#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <thread>

#include "core/store.h"

namespace idemgate::store::redis::testing {

// A caller-side io_context on its own thread, like one gateway worker.
class IoThread {
 public:
  IoThread() : work_(ioc_.get_executor()), thread_([this] { ioc_.run(); }) {}
  ~IoThread() {
    work_.reset();
    thread_.join();
  }

  boost::asio::io_context& context() { return ioc_; }
  boost::asio::any_io_executor executor() { return ioc_.get_executor(); }

  // Runs `task` on this thread and blocks until it finishes.
  template <typename T>
  T Run(core::Task<T> task) {
    std::promise<T> done;
    auto result = done.get_future();
    boost::asio::co_spawn(
        ioc_,
        [&done, t = std::move(task)]() mutable -> core::Task<void> { done.set_value(co_await std::move(t)); },
        boost::asio::detached);
    return result.get();
  }

  // Starts `task` and returns a future for its result.
  template <typename T>
  std::future<T> Start(core::Task<T> task) {
    auto done = std::make_shared<std::promise<T>>();
    auto result = done->get_future();
    boost::asio::co_spawn(
        ioc_,
        [done, t = std::move(task)]() mutable -> core::Task<void> { done->set_value(co_await std::move(t)); },
        boost::asio::detached);
    return result;
  }

 private:
  boost::asio::io_context ioc_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
};

// Polls `condition` every 10 ms until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& condition,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace idemgate::store::redis::testing
