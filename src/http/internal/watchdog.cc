#include "http/internal/watchdog.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace idemgate::http::internal {

namespace asio = boost::asio;

Deadline::Deadline(Watchdog& watchdog, CancelFn cancel, void* target)
    : watchdog_(&watchdog), cancel_(cancel), target_(target) {
  watchdog_->Link(this);
}

Deadline::~Deadline() { watchdog_->Unlink(this); }

Ticker::Ticker(Watchdog& watchdog, TickFn fn, void* target) : watchdog_(&watchdog), fn_(fn), target_(target) {
  watchdog_->Link(this);
}

Ticker::~Ticker() { watchdog_->Unlink(this); }

Watchdog::Watchdog(asio::io_context& io, Duration tick) : io_(io), timer_(io), tick_(tick) {}

Watchdog::~Watchdog() {
  // Deadlines outliving the watchdog would be a lifetime bug; detach them so
  // their destructors stay harmless.
  for (Deadline* d = head_; d != nullptr;) {
    Deadline* next = d->next_;
    d->prev_ = d->next_ = nullptr;
    d = next;
  }
  for (Ticker* t = tickers_; t != nullptr;) {
    Ticker* next = t->next_;
    t->prev_ = t->next_ = nullptr;
    t = next;
  }
}

template <typename Node>
void Watchdog::LinkFront(Node*& head, Node* n) {
  n->next_ = head;
  if (head != nullptr) head->prev_ = n;
  head = n;
}

template <typename Node>
bool Watchdog::UnlinkFrom(Node*& head, Node* n) {
  if (n->prev_ != nullptr) {
    n->prev_->next_ = n->next_;
  } else if (head == n) {
    head = n->next_;
  } else {
    return false;
  }
  if (n->next_ != nullptr) n->next_->prev_ = n->prev_;
  n->prev_ = n->next_ = nullptr;
  return true;
}

void Watchdog::Link(Deadline* d) {
  LinkFront(head_, d);
  ++size_;
}

void Watchdog::Unlink(Deadline* d) {
  if (UnlinkFrom(head_, d)) --size_;
}

void Watchdog::Link(Ticker* t) { LinkFront(tickers_, t); }

void Watchdog::Unlink(Ticker* t) { UnlinkFrom(tickers_, t); }

void Watchdog::Tick(SteadyTime now) {
  for (Ticker* t = tickers_; t != nullptr; t = t->next_) t->fn_(t->target_, now);
}

void Watchdog::Sweep(SteadyTime now) {
  for (Deadline* d = head_; d != nullptr; d = d->next_) {
    if (kill_all_ || d->at_ <= now) {
      d->fired_ = true;
      d->at_ = SteadyTime::max();
      d->cancel_(d->target_);
    }
  }
}

void Watchdog::Start() {
  if (running_) return;
  running_ = true;
  stopping_ = false;
  asio::co_spawn(io_, Run(), asio::detached);
}

void Watchdog::Stop() {
  stopping_ = true;
  timer_.cancel();
}

void Watchdog::KillAll() {
  kill_all_ = true;
  Sweep(SteadyClock::now());
}

asio::awaitable<void> Watchdog::Run() {
  while (!stopping_) {
    timer_.expires_after(tick_);
    co_await timer_.async_wait(asio::as_tuple(asio::use_awaitable));
    if (stopping_) break;
    const SteadyTime now = SteadyClock::now();
    Sweep(now);
    Tick(now);
  }
  running_ = false;
}

}  // namespace idemgate::http::internal
