// Rough throughput of RedisStore against a local redis-server: Reserve +
// Complete pairs and Get hits with N concurrent coroutines spread over T
// caller threads (like gateway workers). Prints figures; asserts nothing.
//
//   redis_store_bench [--address HOST:PORT] [--seconds S] [--concurrency N] [--threads T]
//
// Without --address a private redis-server is started on a free port.

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iostream>
#include <mutex>

#include "store/redis/redis_store.h"
#include "tests/redis/io_thread.h"
#include "tests/redis/redis_server.h"
#include "tests/redis/store_test_util.h"

namespace idemgate::store::redis {
namespace {

using namespace std::chrono_literals;
using testing::IoThread;

struct Args {
  std::string address;
  int seconds = 3;
  int concurrency = 64;
  int threads = 1;
};

struct Totals {
  std::mutex mu;
  std::vector<double> latencies_us;
  std::atomic<std::int64_t> ops{0};
  std::atomic<std::int64_t> errors{0};
};

enum class Mode { kReserveComplete, kGet };

core::Task<int> Loop(RedisStore& store, Mode mode, int id, SteadyTime until, Totals& totals) {
  std::vector<double> lat;
  const SystemClock& clock = SystemClock::Instance();
  const std::string hot = "bench-hot";
  for (int i = 0; SteadyClock::now() < until; ++i) {
    const auto start = SteadyClock::now();
    Status s;
    if (mode == Mode::kReserveComplete) {
      const std::string key = "bench-" + std::to_string(id) + "-" + std::to_string(i);
      const core::Record r = testing::InFlight("o" + std::to_string(id), testing::Fingerprint('b'), clock.NowMillis());
      auto res = co_await store.Reserve(key, r, clock.NowMillis());
      s = res.status();
      if (s.ok()) {
        s = co_await store.Complete(key, r.owner,
                                    testing::CompletedFrom(r, clock.NowMillis(), 60'000, std::string(200, 'b')));
      }
    } else {
      auto got = co_await store.Get(hot, clock.NowMillis());
      s = got.ok() && got->has_value() ? Status::Ok() : InternalError("miss");
    }
    lat.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count());
    if (s.ok()) {
      totals.ops.fetch_add(1);
    } else {
      totals.errors.fetch_add(1);
    }
  }
  std::lock_guard lock(totals.mu);
  totals.latencies_us.insert(totals.latencies_us.end(), lat.begin(), lat.end());
  co_return id;
}

void RunPhase(RedisStore& store, const Args& args, Mode mode, const char* name) {
  std::vector<std::unique_ptr<IoThread>> threads;
  for (int t = 0; t < args.threads; ++t) threads.push_back(std::make_unique<IoThread>());
  Totals totals;
  const auto start = SteadyClock::now();
  const SteadyTime until = start + std::chrono::seconds(args.seconds);
  std::vector<std::future<int>> loops;
  for (int c = 0; c < args.concurrency; ++c) {
    loops.push_back(threads[static_cast<std::size_t>(c % args.threads)]->Start(Loop(store, mode, c, until, totals)));
  }
  for (auto& l : loops) l.get();
  const double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  auto& lat = totals.latencies_us;
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) { return lat.empty() ? 0.0 : lat[static_cast<std::size_t>(p * (lat.size() - 1))]; };
  std::cout << name << ": " << static_cast<std::int64_t>(totals.ops.load() / secs) << " ops/s"
            << " (concurrency " << args.concurrency << ", caller threads " << args.threads << ", errors "
            << totals.errors.load() << "), latency p50 " << pct(0.5) << " us, p99 " << pct(0.99) << " us\n";
}

int Main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--address")) args.address = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) args.seconds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--concurrency")) args.concurrency = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) args.threads = std::atoi(argv[i + 1]);
  }
  std::unique_ptr<testing::RedisServer> server;
  if (args.address.empty()) {
    server = std::make_unique<testing::RedisServer>();
    auto started = server->Start();
    if (!started) {
      std::cerr << "cannot start redis-server: " << started.message() << "\n";
      return 1;
    }
    args.address = server->address();
  }
  RedisStore::Options o;
  o.addresses = {args.address};
  o.timeout = 2s;
  auto store = RedisStore::Connect(o);
  if (!store.ok()) {
    std::cerr << store.status().ToString() << "\n";
    return 1;
  }
  {
    IoThread io;
    const auto now = SystemClock::Instance().NowMillis();
    const core::Record r = testing::InFlight("o", testing::Fingerprint('b'), now);
    auto reserved = io.Run((*store)->Reserve("bench-hot", r, now));
    Status done = reserved.ok() ? io.Run((*store)->Complete("bench-hot", "o",
                                                            testing::CompletedFrom(r, now, 0, std::string(200, 'b'))))
                                : reserved.status();
    if (!done.ok()) {
      std::cerr << "setup: " << done.ToString() << "\n";
      return 1;
    }
  }
  RunPhase(**store, args, Mode::kReserveComplete, "Reserve+Complete (pairs)");
  RunPhase(**store, args, Mode::kGet, "Get (hit, 200-byte body)");
  return 0;
}

}  // namespace
}  // namespace idemgate::store::redis

int main(int argc, char** argv) { return idemgate::store::redis::Main(argc, argv); }
