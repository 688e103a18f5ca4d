#include "core/local_watchers.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace idemgate::core {

namespace asio = boost::asio;

// Shared between the Watch (on its executor) and Notify (any thread); the
// timer and `notified` are only touched on the watch's executor.
struct LocalWatchers::Entry {
  explicit Entry(asio::any_io_executor ex) : executor(ex), timer(ex) {}
  asio::any_io_executor executor;
  asio::steady_timer timer;
  bool notified = false;
};

class LocalWatch final : public Watch {
 public:
  LocalWatch(LocalWatchers* owner, std::string key, std::shared_ptr<LocalWatchers::Entry> entry)
      : owner_(owner), key_(std::move(key)), entry_(std::move(entry)) {}
  ~LocalWatch() override { owner_->Remove(key_, entry_.get()); }

  Task<bool> Changed(Duration timeout) override {
    if (entry_->notified) co_return true;
    entry_->timer.expires_after(timeout);
    boost::system::error_code ec;
    co_await entry_->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    co_return entry_->notified;
  }

 private:
  LocalWatchers* owner_;
  std::string key_;
  std::shared_ptr<LocalWatchers::Entry> entry_;
};

LocalWatchers::LocalWatchers() = default;
LocalWatchers::~LocalWatchers() = default;

Task<std::unique_ptr<Watch>> LocalWatchers::Make(std::string key) {
  auto ex = co_await asio::this_coro::executor;
  auto entry = std::make_shared<Entry>(ex);
  {
    std::lock_guard lock(mu_);
    auto& list = by_key_[key];
    if (list.empty()) watched_keys_.fetch_add(1, std::memory_order_seq_cst);
    list.push_back(entry);
  }
  co_return std::make_unique<LocalWatch>(this, std::move(key), std::move(entry));
}

void LocalWatchers::Notify(std::string_view key) {
  // Orders the caller's write of the key before this load (a store-load
  // pair, which only a full fence orders), against Make's increment before
  // its caller's read.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (watched_keys_.load(std::memory_order_seq_cst) == 0) return;
  // Posted under the lock, each entry moved into its handler: a watch's
  // executor may belong to an io_context that ends right after its watch
  // does (LocalWatch's destructor takes this lock in Remove). Under the
  // lock, either Remove came first and the entry is not here, or the
  // handler is queued before the watch can end; and this thread keeps no
  // reference to an entry whose timer would be destroyed here, after its
  // io_context.
  std::lock_guard lock(mu_);
  auto it = by_key_.find(std::string(key));
  if (it == by_key_.end()) return;
  std::vector<std::shared_ptr<Entry>> woken;
  woken.swap(it->second);
  by_key_.erase(it);
  watched_keys_.fetch_sub(1, std::memory_order_seq_cst);
  for (auto& e : woken) {
    const asio::any_io_executor executor = e->executor;
    asio::post(executor, [e = std::move(e)] {
      e->notified = true;
      e->timer.cancel();
    });
  }
}

void LocalWatchers::Remove(const std::string& key, const Entry* entry) {
  std::lock_guard lock(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  auto& v = it->second;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& e) { return e.get() == entry; }), v.end());
  if (v.empty()) {
    by_key_.erase(it);
    watched_keys_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

std::size_t LocalWatchers::size() const {
  std::lock_guard lock(mu_);
  std::size_t n = 0;
  for (const auto& [k, v] : by_key_) n += v.size();
  return n;
}

}  // namespace idemgate::core
