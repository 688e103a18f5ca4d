// Figures for the embedded store (docs/store-embedded.md):
//   embedded_store_bench throughput [pairs] [io_threads] [coroutines_per_thread]
//     Reserve+Complete pairs per second on unique keys, for sync off/on, with
//     operations committed in batches or one by one.
//   embedded_store_bench rss [records] [body_bytes]
//     Writes `records` completed records, reads a sample back, and prints the
//     process's resident memory and the size on disk.
// Each run uses a fresh directory under $TMPDIR (or /tmp), removed at the end.
#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "store/embedded/embedded_store.h"

namespace {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using idemgate::StatusOr;
using idemgate::core::Record;
using idemgate::core::RecordState;
using idemgate::store::embedded::EmbeddedStore;

std::string MakeTempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/idemgate-bench-XXXXXX";
  if (!mkdtemp(pattern.data())) {
    std::perror("mkdtemp");
    std::exit(1);
  }
  return pattern;
}

std::uint64_t DirBytes(const std::string& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

std::uint64_t StatusKiB(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0)
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return 0;
}

Record Reservation(const std::string& owner, std::int64_t now) {
  Record r;
  r.state = RecordState::kInFlight;
  r.fingerprint = std::string(32, 'f');
  r.owner = owner;
  r.operation_id = "op-" + owner;
  r.created_ms = now;
  r.lease_expires_ms = now + 30'000;
  return r;
}

Record Completion(Record r, const std::string& body, std::int64_t now) {
  r.state = RecordState::kCompleted;
  r.expires_ms = now + 86'400'000;
  r.response.status = 201;
  r.response.headers = {{"content-type", "application/json"}, {"location", "/orders/" + r.owner}};
  r.response.body = body;
  return r;
}

// `unbatched`: one operation per commit (max_batch 1) instead of batches.
std::unique_ptr<EmbeddedStore> OpenStore(const std::string& dir, bool sync, bool unbatched) {
  EmbeddedStore::Options o;
  o.path = dir;
  o.sync = sync;
  if (unbatched) o.max_batch = 1;
  auto store = EmbeddedStore::Open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*store);
}

// Runs `pairs` Reserve+Complete pairs on unique keys from `threads` io_contexts
// with `coroutines` workers each; returns seconds taken.
double Drive(EmbeddedStore& store, std::uint64_t pairs, int threads, int coroutines,
             const std::string& body) {
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> failures{0};
  auto worker = [&]() -> idemgate::core::Task<void> {
    for (;;) {
      const std::uint64_t i = next.fetch_add(1);
      if (i >= pairs) co_return;
      const std::string key = "t-bench:p:s:route:key-" + std::to_string(i);
      const std::string owner = "owner-" + std::to_string(i);
      const std::int64_t now = idemgate::SystemClock::Instance().NowMillis();
      Record r = Reservation(owner, now);
      auto reserved = co_await store.Reserve(key, r, now);
      if (!reserved.ok()) {
        failures.fetch_add(1);
        continue;
      }
      auto done = co_await store.Complete(key, owner, Completion(std::move(r), body, now));
      if (!done.ok()) failures.fetch_add(1);
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      asio::io_context io;
      for (int c = 0; c < coroutines; ++c) {
        asio::co_spawn(io, worker(), [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
      }
      io.run();
    });
  }
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failures.load() != 0) {
    std::fprintf(stderr, "%llu operations failed\n",
                 static_cast<unsigned long long>(failures.load()));
    std::exit(1);
  }
  return seconds;
}

int Throughput(std::uint64_t pairs, int threads, int coroutines) {
  const std::string body(256, 'b');
  std::printf("Reserve+Complete pairs/s, %d I/O threads x %d coroutines, unique keys\n", threads,
              coroutines);
  double base = 0;
  for (bool sync : {false, true}) {
    const std::uint64_t n = sync ? std::max<std::uint64_t>(pairs / 20, 100) : pairs;
    for (bool unbatched : {false, true}) {
      const std::string dir = MakeTempDir();
      double seconds = 0;
      double ops_per_commit = 0;
      {
        auto store = OpenStore(dir, sync, unbatched);
        seconds = Drive(*store, n, threads, coroutines, body);
        ops_per_commit = static_cast<double>(store->committed_operations()) /
                         static_cast<double>(std::max<std::uint64_t>(1, store->commits()));
      }
      fs::remove_all(dir);
      const double rate = static_cast<double>(n) / seconds;
      if (!sync && !unbatched) base = rate;
      std::printf(
          "  sync=%-5s batches=%-3s %10.0f pairs/s  (%llu pairs, %.2fs, %.1f operations per commit, %.2fx of "
          "batched/no-sync)\n",
          sync ? "true" : "false", unbatched ? "off" : "on", rate, static_cast<unsigned long long>(n), seconds,
          ops_per_commit, rate / base);
    }
  }
  return 0;
}

int Rss(std::uint64_t records, std::size_t body_bytes) {
  const std::string dir = MakeTempDir();
  std::mt19937_64 rng(42);
  std::string body(body_bytes, '\0');
  for (auto& c : body) c = static_cast<char>(rng());
  {
    auto store = OpenStore(dir, false, false);
    const double seconds = Drive(*store, records, 2, 8, body);
    std::printf("wrote %llu records (%zu-byte bodies) in %.1fs\n",
                static_cast<unsigned long long>(records), body_bytes, seconds);
    // Random point reads over the whole key range (cold and warm blocks).
    const auto read_start = std::chrono::steady_clock::now();
    asio::io_context io;
    std::uint64_t found = 0;
    asio::co_spawn(
        io,
        [&]() -> idemgate::core::Task<void> {
          for (int i = 0; i < 200'000; ++i) {
            const std::string key = "t-bench:p:s:route:key-" + std::to_string(rng() % records);
            auto got = co_await store->Get(key, idemgate::SystemClock::Instance().NowMillis());
            if (got.ok() && got->has_value()) ++found;
          }
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
    io.run();
    const auto stats = store->Stats();
    const double read_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();
    std::printf("read 200000 random keys in %.1fs, %llu found\n", read_seconds,
                static_cast<unsigned long long>(found));
    std::printf("Stats(): keys~%llu bytes~%llu\n", static_cast<unsigned long long>(stats.keys),
                static_cast<unsigned long long>(stats.bytes));
    std::printf("VmRSS %llu MiB, VmHWM (peak) %llu MiB, on disk %llu MiB\n",
                static_cast<unsigned long long>(StatusKiB("VmRSS") / 1024),
                static_cast<unsigned long long>(StatusKiB("VmHWM") / 1024),
                static_cast<unsigned long long>(DirBytes(dir) >> 20));
  }
  fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throughput";
  auto arg = [&](int i, std::uint64_t fallback) {
    return argc > i ? std::strtoull(argv[i], nullptr, 10) : fallback;
  };
  if (mode == "throughput") {
    return Throughput(arg(2, 200'000), static_cast<int>(arg(3, 2)), static_cast<int>(arg(4, 16)));
  }
  if (mode == "rss") return Rss(arg(2, 1'000'000), static_cast<std::size_t>(arg(3, 256)));
  std::fprintf(
      stderr,
      "usage: %s throughput [pairs] [io_threads] [coroutines] | rss [records] [body_bytes]\n",
      argv[0]);
  return 2;
}
