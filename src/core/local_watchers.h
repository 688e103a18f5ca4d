#pragma once

#include <memory>
#include <atomic>
#include <mutex>
#include <string_view>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/store.h"

namespace idemgate::core {

// In-process key watchers for stores whose every writer lives in this
// process (memory, embedded). Notify() may be called from any thread; each
// Watch wakes on the executor that made it. Thread-safe.
class LocalWatchers {
 public:
  LocalWatchers();
  ~LocalWatchers();
  LocalWatchers(const LocalWatchers&) = delete;
  LocalWatchers& operator=(const LocalWatchers&) = delete;

  // Must be awaited on the executor that will await Watch::Changed.
  Task<std::unique_ptr<Watch>> Make(std::string key);
  // Wakes every current watch of `key`. Costs one atomic load when nobody
  // watches anything.
  void Notify(std::string_view key);
  // Number of registered watches (for tests).
  std::size_t size() const;

  struct Entry;

 private:
  friend class LocalWatch;
  void Remove(const std::string& key, const Entry* entry);

  mutable std::mutex mu_;
  // Keys in by_key_, readable without mu_. A watch is registered (an atomic
  // increment) before its caller reads the key; a notifier writes the key,
  // then (after a full fence) reads this. So either the watcher's read sees
  // the write or the notifier sees the watch: nothing is missed.
  std::atomic<std::size_t> watched_keys_{0};
  std::unordered_map<std::string, std::vector<std::shared_ptr<Entry>>> by_key_;
};

}  // namespace idemgate::core
