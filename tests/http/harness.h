#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fakes/testing.h"
#include "http/exchange.h"
#include "http/problem.h"
#include "http/server.h"
#include "http/upstream_pool.h"

// An in-process http::Server whose handler forwards every request to one
// upstream through a per-worker UpstreamPool, recording what happened.
namespace idemgate::httptest {

using namespace std::chrono_literals;

// Records what a ForwardObserver was told.
class RecordingObserver final : public http::ForwardObserver {
 public:
  http::Task<void> OnResponse(http::CapturedResponse& captured) override {
    this->captured = captured;
    ++on_response_calls;
    co_return;
  }
  http::Task<void> OnNoResponse(const http::ForwardResult& result) override {
    no_response = result;
    ++on_no_response_calls;
    answered_before_no_response = exchange != nullptr && exchange->responded();
    co_return;
  }
  http::Task<void> OnFinished(const http::ForwardResult& result) override {
    finished = result;
    ++on_finished_calls;
    co_return;
  }

  http::Exchange* exchange = nullptr;  // the exchange forwarding, while it runs
  std::optional<http::CapturedResponse> captured;
  std::optional<http::ForwardResult> no_response;
  std::optional<http::ForwardResult> finished;
  int on_response_calls = 0;
  int on_no_response_calls = 0;
  int on_finished_calls = 0;
  bool answered_before_no_response = false;
};

struct HandlerOptions {
  http::UpstreamTarget target;
  bool read_body_first = false;        // ReadBody before Forward (the fingerprint case)
  std::optional<std::uint64_t> body_limit;
  bool capture = false;                // forward with a RecordingObserver
  std::uint64_t capture_cap = 1024 * 1024;
  http::ForwardRequest base;           // header changes to apply
};

class ForwardHandler final : public http::Handler {
 public:
  ForwardHandler(HandlerOptions options, std::size_t workers) : options_(std::move(options)), pools_(workers) {}

  http::Task<void> Handle(http::Exchange& ex) override {
    auto& pool = pools_[ex.worker().index()];
    if (!pool) pool = std::make_unique<http::UpstreamPool>(ex.worker(), options_.target);
    if (options_.body_limit && !ex.SetBodyLimit(*options_.body_limit)) {
      co_await ex.Respond(http::MakeProblem(http::ProblemCode::kRequestTooLarge, "too large"));
      co_return;
    }
    if (options_.read_body_first) {
      const http::BodyStatus status = co_await ex.ReadBody();
      if (status != http::BodyStatus::kOk) {
        co_await ex.Respond(http::MakeProblem(status == http::BodyStatus::kTooLarge
                                                  ? http::ProblemCode::kRequestTooLarge
                                                  : http::ProblemCode::kBadRequest,
                                              "body"));
        co_return;
      }
    }
    http::ForwardRequest request = options_.base;
    RecordingObserver observer;
    if (options_.capture) {
      observer.exchange = &ex;
      request.observer = &observer;
      request.capture_max_body_bytes = options_.capture_cap;
    }
    http::ForwardResult result = co_await ex.Forward(*pool, request);
    if (options_.capture) co_await observer.OnFinished(result);
    observer.exchange = nullptr;
    std::lock_guard lock(mu_);
    results_.push_back(result);
    if (options_.capture) observers_.push_back(std::move(observer));
  }

  // Waits (bounded) until `n` exchanges were recorded: the handler records
  // after the client already has its response.
  bool WaitForResults(std::size_t n) const {
    return testing::PollUntil([&] {
      std::lock_guard lock(mu_);
      return results_.size() >= n;
    }, 10s);
  }

  std::vector<http::ForwardResult> results() const {
    std::lock_guard lock(mu_);
    return results_;
  }
  std::vector<RecordingObserver> observers() const {
    std::lock_guard lock(mu_);
    return observers_;
  }
  // Only once the server has stopped.
  void ClearPools() {
    for (auto& p : pools_) p.reset();
  }

 private:
  HandlerOptions options_;
  std::vector<std::unique_ptr<http::UpstreamPool>> pools_;  // by worker index
  mutable std::mutex mu_;
  std::vector<http::ForwardResult> results_;
  std::vector<RecordingObserver> observers_;
};

class Harness {
 public:
  explicit Harness(HandlerOptions options, http::ServerOptions server_options = DefaultServerOptions())
      : server_(server_options), handler_(std::move(options), server_.worker_count()) {
    auto bound = server_.Listen("127.0.0.1", 0, handler_, true);
    if (bound.ok()) port_ = bound->port;
    server_.Start();
  }
  ~Harness() {
    server_.Stop(2s);
    handler_.ClearPools();
  }

  static http::ServerOptions DefaultServerOptions() {
    http::ServerOptions o;
    o.workers = 1;
    o.tick = 20ms;
    return o;
  }

  testing::HostPort endpoint() const { return {"127.0.0.1", port_}; }
  std::uint16_t port() const { return port_; }
  http::Server& server() { return server_; }
  ForwardHandler& handler() { return handler_; }

 private:
  http::Server server_;
  ForwardHandler handler_;
  std::uint16_t port_ = 0;
};

inline http::UpstreamTarget TargetFor(std::uint16_t port) {
  http::UpstreamTarget t;
  t.name = "test";
  t.host = "127.0.0.1";
  t.port = port;
  t.connect_timeout = 2s;
  t.timeout = 10s;
  t.max_connections = 8;
  return t;
}

}  // namespace idemgate::httptest
