// Memory and disk footprint of the stores: writes N completed records (a
// reservation, then its completion, as the gateway does) with a 200-byte
// response body into each store, then prints the process RSS (VmRSS, VmHWM),
// the store's own accounting and, for the embedded store, the size on disk.
//
//   store_memory_bench [--records N] [--dir DIR] [--store memory|embedded|all]
//
// Each store runs in its own child process so that one's high-water mark does
// not hide the other's. Exits non-zero when a store operation fails or a
// record read back differs from what was written.

#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "core/record.h"
#include "core/store.h"
#include "store/memory/memory_store.h"
#ifdef IDEMGATE_BENCH_HAVE_EMBEDDED
#include "store/embedded/embedded_store.h"
#endif

namespace idemgate::bench {
namespace {

namespace fs = std::filesystem;
namespace asio = boost::asio;

constexpr std::size_t kBodyBytes = 200;
constexpr int kWorkers = 32;  // coroutines writing concurrently
constexpr UnixMillis kRetentionMs = 24LL * 3600 * 1000;
constexpr UnixMillis kLeaseMs = 35'000;

struct Options {
  std::uint64_t records = 1'000'000;
  std::string dir;
  std::string store = "all";
};

// A kernel-reported figure from /proc/self/status, in KiB (0 if absent).
std::uint64_t ProcStatusKiB(std::string_view field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size(), field) == 0 && line.size() > field.size() &&
        line[field.size()] == ':') {
      return std::strtoull(line.c_str() + field.size() + 1, nullptr, 10);
    }
  }
  return 0;
}

std::uint64_t DirBytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  }
  return total;
}

double MiB(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string KeyFor(std::uint64_t i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "t-_:_:_:bench:order-%010llu", static_cast<unsigned long long>(i));
  return buf;
}

// Deterministic per-record content, random enough that compression in the
// embedded store does not make the figures look better than real traffic.
struct RecordMaker {
  explicit RecordMaker(UnixMillis now) : now_(now) {}

  // splitmix64: cheap to seed per record, unlike std::mt19937_64.
  struct Rng {
    std::uint64_t state;
    std::uint64_t operator()() {
      std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      return z ^ (z >> 31);
    }
  };

  static std::string Hex(Rng& rng, std::size_t n) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string s(n, '0');
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i % 16 == 0) bits = rng();
      s[i] = kDigits[bits & 15];
      bits >>= 4;
    }
    return s;
  }

  core::Record Reservation(std::uint64_t i) {
    Rng rng{i * 2 + 1};
    core::Record r;
    r.state = core::RecordState::kInFlight;
    r.fingerprint.resize(32);
    for (char& c : r.fingerprint) c = static_cast<char>(rng());
    r.owner = Hex(rng, 16);
    r.operation_id = "op_" + Hex(rng, 24);
    r.created_ms = now_;
    r.lease_expires_ms = now_ + kLeaseMs;
    return r;
  }

  core::Record Completed(std::uint64_t i, core::Record reservation) {
    Rng rng{i * 2 + 2};
    core::Record r = std::move(reservation);
    r.state = core::RecordState::kCompleted;
    r.lease_expires_ms = 0;
    r.expires_ms = now_ + kRetentionMs;
    r.response.status = 201;
    r.response.headers = {{"Content-Type", "application/json"},
                          {"Content-Length", std::to_string(kBodyBytes)},
                          {"X-Request-Id", Hex(rng, 32)}};
    std::string body = "{\"id\":\"pay_" + Hex(rng, 24) + "\",\"status\":\"succeeded\",\"data\":\"";
    body += Hex(rng, kBodyBytes - body.size() - 2);
    body += "\"}";
    r.response.body = std::move(body);
    return r;
  }

 private:
  UnixMillis now_;
};

struct FillResult {
  bool ok = true;
  std::string error;
};

// Worker `w` of `workers` writes records w, w + workers, ... through the
// async Store interface.
core::Task<void> FillWorker(core::Store& store, RecordMaker& maker, std::uint64_t records, int w,
                            int workers, UnixMillis now, FillResult& result) {
  for (std::uint64_t i = static_cast<std::uint64_t>(w); i < records && result.ok;
       i += static_cast<std::uint64_t>(workers)) {
    std::string key = KeyFor(i);
    core::Record reservation = maker.Reservation(i);
    std::string owner = reservation.owner;
    auto reserved = co_await store.Reserve(key, reservation, now);
    if (!reserved.ok() || reserved->outcome != core::ReserveOutcome::kReserved) {
      result.ok = false;
      result.error =
          "Reserve(" + key + "): " +
          (reserved.ok() ? std::string("key already exists") : reserved.status().ToString());
      co_return;
    }
    Status done = co_await store.Complete(key, owner, maker.Completed(i, std::move(reservation)));
    if (!done.ok()) {
      result.ok = false;
      result.error = "Complete(" + key + "): " + done.ToString();
      co_return;
    }
  }
}

// Reads back a sample of records and compares them with what was written.
core::Task<void> Verify(core::Store& store, RecordMaker& maker, std::uint64_t records,
                        UnixMillis now, FillResult& result) {
  const std::uint64_t step = records > 1000 ? records / 1000 : 1;
  for (std::uint64_t i = 0; i < records; i += step) {
    auto got = co_await store.Get(KeyFor(i), now);
    core::Record want = maker.Completed(i, maker.Reservation(i));
    if (!got.ok() || !got->has_value() || **got != want) {
      result.ok = false;
      result.error = "record " + KeyFor(i) + " read back " +
                     (!got.ok()          ? got.status().ToString()
                      : got->has_value() ? "different"
                                         : "missing");
      co_return;
    }
  }
}

FillResult Fill(core::Store& store, std::uint64_t records, UnixMillis now) {
  asio::io_context io(1);
  RecordMaker maker(now);
  FillResult result;
  for (int w = 0; w < kWorkers; ++w) {
    asio::co_spawn(io, FillWorker(store, maker, records, w, kWorkers, now, result), asio::detached);
  }
  io.run();
  if (result.ok) {
    io.restart();
    asio::co_spawn(io, Verify(store, maker, records, now, result), asio::detached);
    io.run();
  }
  return result;
}

std::unique_ptr<core::Store> MakeStore(const std::string& kind, const fs::path& dir) {
  if (kind == "memory") {
    return std::make_unique<store::memory::MemoryStore>(std::uint64_t{16} << 30,
                                                        SystemClock::Instance());
  }
#ifdef IDEMGATE_BENCH_HAVE_EMBEDDED
  if (kind == "embedded") {
    // The options idemgate uses for `store: { kind: embedded, sync: false }`.
    store::embedded::EmbeddedStore::Options options;
    options.path = dir.string();
    options.sync = false;
    auto opened = store::embedded::EmbeddedStore::Open(std::move(options));
    if (!opened.ok()) {
      std::fprintf(stderr, "store_memory_bench: %s\n", opened.status().ToString().c_str());
      return nullptr;
    }
    return std::move(opened).value();
  }
#else
  (void)dir;
#endif
  return nullptr;
}

// Runs one store in this process; prints its line; returns the exit status.
int RunOne(const std::string& kind, const Options& options) {
  const fs::path dir = fs::path(options.dir) / kind;
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  const std::uint64_t rss_before = ProcStatusKiB("VmRSS");
  std::unique_ptr<core::Store> store = MakeStore(kind, dir);
  if (store == nullptr) {
    std::fprintf(stderr, "store_memory_bench: no %s store (not built, or it failed to open)\n",
                 kind.c_str());
    return 2;
  }
  const UnixMillis now = SystemClock::Instance().NowMillis();
  const auto start = std::chrono::steady_clock::now();
  FillResult result = Fill(*store, options.records, now);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!result.ok) {
    std::fprintf(stderr, "store_memory_bench: %s: %s\n", kind.c_str(), result.error.c_str());
    return 1;
  }
  const std::uint64_t rss = ProcStatusKiB("VmRSS");
  const std::uint64_t hwm = ProcStatusKiB("VmHWM");
  const core::StoreStats stats = store->Stats();
  const std::uint64_t disk_open = DirBytes(dir);
  store.reset();
  const std::uint64_t disk_closed = DirBytes(dir);
  const double per_record = static_cast<double>(rss > rss_before ? rss - rss_before : 0) * 1024.0 /
                            static_cast<double>(options.records);
  char disk[96] = "";
  if (kind != "memory") {
    std::snprintf(disk, sizeof disk, "  disk %.1f MiB open, %.1f MiB closed", MiB(disk_open),
                  MiB(disk_closed));
  }
  std::printf(
      "%-9s %llu records in %.1fs (%.0f records/s)  VmRSS %.1f MiB (%.0f B/record over the "
      "empty process)  VmHWM %.1f MiB  store accounting %.1f MiB%s\n",
      kind.c_str(), static_cast<unsigned long long>(options.records), seconds,
      static_cast<double>(options.records) / seconds, MiB(rss * 1024), per_record, MiB(hwm * 1024),
      MiB(stats.bytes), disk);
  std::printf(
      "STORE_MEMORY store=%s records=%llu seconds=%.2f rss_before_kib=%llu rss_kib=%llu "
      "hwm_kib=%llu stats_keys=%llu stats_bytes=%llu disk_open_bytes=%llu "
      "disk_closed_bytes=%llu\n",
      kind.c_str(), static_cast<unsigned long long>(options.records), seconds,
      static_cast<unsigned long long>(rss_before), static_cast<unsigned long long>(rss),
      static_cast<unsigned long long>(hwm), static_cast<unsigned long long>(stats.keys),
      static_cast<unsigned long long>(stats.bytes), static_cast<unsigned long long>(disk_open),
      static_cast<unsigned long long>(disk_closed));
  std::fflush(stdout);
  fs::remove_all(dir, ec);
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: store_memory_bench [--records N] [--dir DIR] "
               "[--store memory|embedded|all]\n");
  return 2;
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (i + 1 >= argc) return Usage();
    if (arg == "--records") {
      options.records = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--dir") {
      options.dir = argv[++i];
    } else if (arg == "--store") {
      options.store = argv[++i];
    } else {
      return Usage();
    }
  }
  if (options.records == 0) return Usage();
  bool own_dir = false;
  if (options.dir.empty()) {
    char tmpl[] = "/tmp/idemgate-store-bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("store_memory_bench: mkdtemp");
      return 1;
    }
    options.dir = tmpl;
    own_dir = true;
  }
  std::vector<std::string> kinds;
  if (options.store == "all") {
    kinds = {"memory"};
#ifdef IDEMGATE_BENCH_HAVE_EMBEDDED
    kinds.push_back("embedded");
#endif
  } else if (options.store == "memory" || options.store == "embedded") {
    kinds = {options.store};
  } else {
    return Usage();
  }
  std::printf("store_memory_bench: %llu completed records per store, %zu-byte bodies\n",
              static_cast<unsigned long long>(options.records), kBodyBytes);
  std::fflush(stdout);
  int status = 0;
  for (const std::string& kind : kinds) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("store_memory_bench: fork");
      return 1;
    }
    if (pid == 0) {
      std::fflush(stdout);
      _exit(RunOne(kind, options));
    }
    int child = 0;
    if (waitpid(pid, &child, 0) < 0 || !WIFEXITED(child) || WEXITSTATUS(child) != 0) {
      std::fprintf(stderr, "store_memory_bench: %s run failed\n", kind.c_str());
      status = 1;
    }
  }
  if (own_dir) {
    std::error_code ec;
    fs::remove_all(options.dir, ec);
  }
  return status;
}

}  // namespace
}  // namespace idemgate::bench

int main(int argc, char** argv) { return idemgate::bench::Main(argc, argv); }
