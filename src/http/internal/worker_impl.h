#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "http/internal/watchdog.h"
#include "http/server.h"
#include "http/tls.h"

// What a worker thread owns. Internal to src/http. Everything here is used
// on the worker's own thread only, except `connections` (read by Stop) and
// the io_context (posted to).
namespace idemgate::http {
namespace internal {

// Relay buffers for streamed bodies: kBlockSize each, recycled per worker so
// that streaming costs no allocation once warm, and idle connections hold
// none.
inline constexpr std::size_t kBlockSize = 64 * 1024;

class BlockPool {
 public:
  BlockPool() = default;
  ~BlockPool() {
    for (char* b : free_) delete[] b;
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  char* Get() {
    if (free_.empty()) return new char[kBlockSize];
    char* b = free_.back();
    free_.pop_back();
    return b;
  }
  void Put(char* b) {
    if (free_.size() < kMaxFree) {
      free_.push_back(b);
    } else {
      delete[] b;
    }
  }

 private:
  static constexpr std::size_t kMaxFree = 64;
  std::vector<char*> free_;
};

// One block borrowed from a pool for a scope.
class Block {
 public:
  explicit Block(BlockPool& pool) : pool_(&pool), data_(pool.Get()) {}
  ~Block() {
    if (data_ != nullptr) pool_->Put(data_);
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  char* data() const { return data_; }
  static constexpr std::size_t size() { return kBlockSize; }

 private:
  BlockPool* pool_;
  char* data_;
};

// A client connection as the worker sees it, for draining.
class SessionNode {
 public:
  virtual ~SessionNode() = default;
  // The server started draining: close now if waiting for a request.
  virtual void OnDrain() = 0;

 private:
  friend class SessionList;
  SessionNode* prev_ = nullptr;
  SessionNode* next_ = nullptr;
};

class SessionList {
 public:
  void Add(SessionNode* s) {
    s->next_ = head_;
    if (head_ != nullptr) head_->prev_ = s;
    head_ = s;
    ++size_;
  }
  void Remove(SessionNode* s) {
    if (s->prev_ != nullptr) {
      s->prev_->next_ = s->next_;
    } else {
      head_ = s->next_;
    }
    if (s->next_ != nullptr) s->next_->prev_ = s->prev_;
    s->prev_ = s->next_ = nullptr;
    --size_;
  }
  template <typename F>
  void ForEach(F&& f) {
    for (SessionNode* s = head_; s != nullptr;) {
      SessionNode* next = s->next_;
      f(*s);
      s = next;
    }
  }
  std::size_t size() const { return size_; }

 private:
  SessionNode* head_ = nullptr;
  std::size_t size_ = 0;
};

struct Listener {
  boost::asio::ip::tcp::acceptor acceptor;
  Handler* handler;
  TlsContextSlot* tls;  // null: plain HTTP
  Listener(boost::asio::io_context& io, Handler* h, TlsContextSlot* t) : acceptor(io), handler(h), tls(t) {}
};

}  // namespace internal

struct Worker::Impl {
  Impl(const ServerOptions& options)
      : io(1), watchdog(io, options.tick), limits(options.limits) {}

  boost::asio::io_context io;
  internal::Watchdog watchdog;
  Limits limits;
  bool draining = false;
  std::vector<std::unique_ptr<internal::Listener>> listeners;
  internal::SessionList sessions;
  internal::BlockPool blocks;
  // Open client connections, readable from any thread.
  std::atomic<std::size_t> connections{0};
  // The server's count of accepted connections not yet closed (all
  // workers), for Limits::max_connections.
  std::atomic<std::size_t>* admitted = nullptr;
  Worker* self = nullptr;
};

}  // namespace idemgate::http
