#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>

#include "common/units.h"

// Deadlines for socket operations without a timer per operation: every
// Deadline registers with its worker's Watchdog, which wakes every `tick`
// and cancels the target of each Deadline that has passed. Arming or
// disarming a Deadline only stores a time point, so the hot path pays no
// timer syscalls. Timeouts fire up to one tick late. Tickers run on every
// tick after the deadlines, for periodic work of the worker's own.
// Single-threaded: everything runs on the worker's thread.
// Internal to src/http.
namespace idemgate::http::internal {

using SteadyClock = std::chrono::steady_clock;
using SteadyTime = SteadyClock::time_point;

class Watchdog;

class Deadline {
 public:
  // Called when the deadline passes (or on a hard stop); typically cancels
  // the pending operations of a socket. Must not destroy Deadlines.
  using CancelFn = void (*)(void* target);

  Deadline(Watchdog& watchdog, CancelFn cancel, void* target);
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  // Arms the deadline `d` from now and clears fired().
  void ExpireAfter(Duration d) { ExpireAt(SteadyClock::now() + d); }
  void ExpireAt(SteadyTime at) {
    at_ = at;
    fired_ = false;
  }
  // No deadline; clears fired().
  void Disarm() {
    at_ = SteadyTime::max();
    fired_ = false;
  }
  // True once the armed deadline passed and the target was cancelled (or a
  // hard stop cancelled it). An operation that fails after this was cut by
  // the deadline; an operation started after this must not be started.
  bool fired() const { return fired_; }
  bool armed() const { return at_ != SteadyTime::max(); }
  SteadyTime at() const { return at_; }

 private:
  friend class Watchdog;
  Watchdog* watchdog_;
  CancelFn cancel_;
  void* target_;
  SteadyTime at_ = SteadyTime::max();
  bool fired_ = false;
  Deadline* prev_ = nullptr;
  Deadline* next_ = nullptr;
};

// Work done on every tick of a Watchdog, after its deadlines: an upstream
// pool closing idle connections the upstream closed. Unlike a Deadline's
// cancel function, `fn` may destroy Deadlines, but not Tickers.
class Ticker {
 public:
  using TickFn = void (*)(void* target, SteadyTime now);

  Ticker(Watchdog& watchdog, TickFn fn, void* target);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

 private:
  friend class Watchdog;
  Watchdog* watchdog_;
  TickFn fn_;
  void* target_;
  Ticker* prev_ = nullptr;
  Ticker* next_ = nullptr;
};

class Watchdog {
 public:
  Watchdog(boost::asio::io_context& io, Duration tick);
  ~Watchdog();

  // Starts the sweeping coroutine on the io_context.
  void Start();
  // Ends the sweeping coroutine (after its current wait).
  void Stop();
  // Hard stop: fires every Deadline now and keeps firing every Deadline on
  // every tick until Stop, so operations started afterwards are cut too.
  void KillAll();
  bool killing() const { return kill_all_; }

  std::size_t size() const { return size_; }

 private:
  friend class Deadline;
  friend class Ticker;
  void Link(Deadline* d);
  void Unlink(Deadline* d);
  void Link(Ticker* t);
  void Unlink(Ticker* t);
  // The deadline and ticker lists: intrusive, doubly linked, newest first.
  // UnlinkFrom is false when `n` is in no list (detached already).
  template <typename Node>
  static void LinkFront(Node*& head, Node* n);
  template <typename Node>
  static bool UnlinkFrom(Node*& head, Node* n);
  void Sweep(SteadyTime now);
  void Tick(SteadyTime now);
  boost::asio::awaitable<void> Run();

  boost::asio::io_context& io_;
  boost::asio::steady_timer timer_;
  Duration tick_;
  Deadline* head_ = nullptr;
  Ticker* tickers_ = nullptr;
  std::size_t size_ = 0;
  bool stopping_ = false;
  bool kill_all_ = false;
  bool running_ = false;
};

}  // namespace idemgate::http::internal
