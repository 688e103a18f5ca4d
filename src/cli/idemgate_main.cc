// idemgate: the gateway server. Thin: parses the command line, loads the
// config, wires the libraries together, runs until SIGTERM/SIGINT (SIGHUP
// reloads the config).
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "admin/admin_api.h"
#include "admin/gateway_metrics.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/text.h"
#include "config/address.h"
#include "config/loader.h"
#include "config/reload_changes.h"
#include "config/warnings.h"
#include "gateway/admin_handler.h"
#include "gateway/gateway.h"
#include "gateway/idempotency_stage.h"
#include "gateway/identity_stage.h"
#include "gateway/jwks_refresher.h"
#include "gateway/webhook_stage.h"
#include "http/server.h"
#include "http/tls.h"
#include "store/factory/store_factory.h"

namespace idemgate::cli {
namespace {

constexpr std::string_view kVersion = IDEMGATE_VERSION_STRING;

// After the data path has drained on SIGTERM, how long admin requests still in
// progress (a scrape, a readiness probe) get before the admin listener closes.
constexpr Duration kAdminStopGrace = std::chrono::seconds(2);

constexpr std::string_view kUsage =
    "idemgate: an HTTP idempotency gateway. Clients may retry a write with the\n"
    "same Idempotency-Key; the backend runs it at most once and every retry\n"
    "gets the first outcome back.\n"
    "\n"
    "Usage:\n"
    "  idemgate --config FILE [--ready-file PATH]   run the gateway\n"
    "  idemgate check-config FILE                    validate FILE and exit\n"
    "  idemgate check-config --help                  what check-config checks\n"
    "  idemgate --version                            print the version\n"
    "  idemgate --help                               this text\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE      YAML config (see docs/configuration.md and\n"
    "                         examples/quickstart.yaml)\n"
    "  --ready-file PATH      once listening, write \"listen=HOST:PORT\" and\n"
    "                         \"admin=HOST:PORT\" lines to PATH (atomically), so a\n"
    "                         supervisor or test can learn ports chosen with :0\n"
    "\n"
    "Signals:\n"
    "  SIGTERM, SIGINT        stop accepting, give in-flight requests up to\n"
    "                         shutdown_grace to finish, release the keys of\n"
    "                         those still running then, exit 0 (a second\n"
    "                         signal ends the grace at once)\n"
    "  SIGHUP                 reload the config file without dropping\n"
    "                         connections, and read again the files it names:\n"
    "                         TLS certificates and keys, JWT keys, the API keys\n"
    "                         file, webhook secrets (listen, workers, store,\n"
    "                         metrics.tenant_labels, the admin token and secrets\n"
    "                         from the environment need a restart)\n"
    "\n"
    "Exit status: 0 after SIGTERM or SIGINT, whether or not every request\n"
    "finished within shutdown_grace (the log's \"stopped\" line says which),\n"
    "and for a valid config, --help and --version; 1 on a config or start-up\n"
    "error; 2 on a usage error.\n";

constexpr std::string_view kCheckConfigUsage =
    "Usage: idemgate check-config FILE\n"
    "\n"
    "Checks FILE as a start would, without starting: the YAML and every setting,\n"
    "and the files it names (TLS certificates and keys, identity keys, the API keys\n"
    "file, secret files). A secret named by an environment variable that is not set\n"
    "here is noted, not required; a jwks_url is not fetched; the store is not\n"
    "opened.\n"
    "\n"
    "Prints \"FILE: ok\" on stdout when FILE is valid; notes and warnings (a\n"
    "shutdown_grace below an upstream's timeout) go to stderr and do not change\n"
    "the result.\n"
    "\n"
    "Exit status: 0 valid (and for --help), 1 invalid (the reason on stderr),\n"
    "2 on a usage error.\n";

struct Args {
  enum class Mode { kRun, kCheck, kCheckHelp, kVersion, kHelp } mode = Mode::kRun;
  std::string config;
  std::string ready_file;
};

void Print(FILE* f, std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), f);
  std::fflush(f);
}

// Prints `line` and a newline, its control characters and bytes that are not
// UTF-8 escaped (Printable): a message may quote the config (a YAML key, a
// file name), and a newline or an escape sequence in it must neither break
// the line nor reach the terminal.
void PrintLine(FILE* f, std::string_view line) { Print(f, Printable(line) + "\n"); }

std::optional<Args> ParseArgs(int argc, char** argv, std::string* error) {
  Args args;
  std::vector<std::string_view> a(argv + 1, argv + argc);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::string_view arg = a[i];
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (i + 1 >= a.size()) {
        *error = std::string(name) + (name == "check-config" ? " needs the config FILE to check" : " needs a value");
        return std::nullopt;
      }
      return std::string(a[++i]);
    };
    if (arg == "--help" || arg == "-h" || arg == "help") {
      // After check-config, its own usage.
      args.mode = args.mode == Args::Mode::kCheck ? Args::Mode::kCheckHelp : Args::Mode::kHelp;
      return args;
    } else if (arg == "--version" || arg == "-V" || arg == "version") {
      if (a.size() != 1) {
        *error = std::string(arg) + " takes no other arguments";
        return std::nullopt;
      }
      args.mode = Args::Mode::kVersion;
      return args;
    } else if (arg == "check-config") {
      args.mode = Args::Mode::kCheck;
      if (i + 1 < a.size() && (a[i + 1] == "--help" || a[i + 1] == "-h")) continue;
      auto v = value("check-config");
      if (!v) return std::nullopt;
      args.config = *v;
    } else if (arg == "--config" || arg == "-c") {
      auto v = value(arg);
      if (!v) return std::nullopt;
      args.config = *v;
    } else if (arg.starts_with("--config=")) {
      args.config = std::string(arg.substr(9));
    } else if (arg == "--ready-file") {
      auto v = value(arg);
      if (!v) return std::nullopt;
      args.ready_file = *v;
    } else if (arg.starts_with("--ready-file=")) {
      args.ready_file = std::string(arg.substr(13));
    } else {
      *error = "unknown argument: " + std::string(arg);
      return std::nullopt;
    }
  }
  if (args.config.empty()) {
    *error = "no config file given (--config FILE)";
    return std::nullopt;
  }
  return args;
}

// Writes `contents` to `path` atomically (PATH.tmp, then rename).
Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return UnavailableError("cannot write " + tmp + ": " + std::strerror(errno));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) return UnavailableError("cannot write " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return UnavailableError("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

void ApplyLogSettings(const config::Config& config) {
  if (auto level = ParseLogLevel(config.log.level)) SetLogLevel(*level);
  SetLogFormat(config.log.format == "text" ? LogFormat::kText : LogFormat::kJson);
}

// The admin listener's limits: the data listener's, without max_connections
// (which counts the clients of `listen` only).
// The admin listener's connections (probes, scrapes, operators) are not
// counted in limits.max_connections, and have a fixed bound of their own so
// that a flood of them cannot take the file descriptors the data path needs.
constexpr std::size_t kAdminMaxConnections = 256;

http::Limits AdminLimits(const config::Config& config) {
  http::Limits limits = gateway::LimitsFromConfig(config);
  limits.max_connections = kAdminMaxConnections;
  limits.max_connections_name = "admin listener";
  return limits;
}

// Each client connection is a file descriptor, and so is each pooled
// upstream connection; the store, the admin listener and the log need a few
// more. A soft RLIMIT_NOFILE below that lets a connection flood exhaust
// descriptors (failing upstream connects and store files) before
// limits.max_connections refuses anything.
void WarnIfFewFileDescriptors(const config::Config& config) {
  constexpr std::uint64_t kReserve = 256;
  std::uint64_t wanted = config.limits.max_connections + kReserve;
  if (!config.admin.listen.empty()) wanted += kAdminMaxConnections;
  for (const auto& [name, upstream] : config.upstreams) wanted += upstream.max_connections;
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY) return;
  if (static_cast<std::uint64_t>(nofile.rlim_cur) >= wanted) return;
  LogWarn("the open-file limit is low for limits.max_connections and the upstream pools; raise it (ulimit -n, "
          "systemd LimitNOFILE=) or lower limits.max_connections",
          {{"max_connections", config.limits.max_connections},
           {"nofile", static_cast<std::uint64_t>(nofile.rlim_cur)},
           {"wanted", wanted}});
}

// A shutdown_grace shorter than the timeout of an upstream that routes store
// keys through lets SIGTERM release keys of requests the upstream may still
// run (config::ShutdownGraceWarnings). Said at start and on every reload.
void WarnIfShortShutdownGrace(const config::Config& config) {
  for (const std::string& warning : config::ShutdownGraceWarnings(config)) {
    LogWarn("shutdown_grace is below the timeout of an upstream that stores keys", {{"detail", warning}});
  }
}

StatusOr<std::shared_ptr<const http::TlsContext>> MakeListenerTls(const config::ListenerTls& tls) {
  return http::MakeServerTls(http::ServerTlsOptions{
      .cert_file = tls.cert_file, .key_file = tls.key_file, .client_ca_file = tls.client_ca_file});
}

// The identity.jwt settings for the JWKS refresher: none unless the mode is jwt.
config::JwtIdentity JwksSettings(const config::Config& config) {
  return config.identity.mode == config::IdentityMode::kJwt ? config.identity.jwt : config::JwtIdentity{};
}

int CheckConfig(const std::string& path) {
  auto config = config::LoadFile(path);
  if (!config.ok()) {
    PrintLine(stderr, config.status().message());
    return 1;
  }
  // The TLS files are read as a start would read them, so that a missing
  // file, an encrypted key or a key that does not match its certificate is
  // found here and not at the start.
  for (auto [settings, name] : {std::pair{&config->tls, "tls"}, std::pair{&config->admin.tls, "admin.tls"}}) {
    if (!settings->configured) continue;
    if (auto tls = MakeListenerTls(*settings); !tls.ok()) {
      PrintLine(stderr, path + ": " + name + ": " + tls.status().message());
      return 1;
    }
  }
  for (const auto& [name, u] : config->upstreams) {
    if (u.scheme != "https") continue;
    if (auto tls = gateway::UpstreamTlsFromConfig(name, u); !tls.ok()) {
      PrintLine(stderr, path + ": " + tls.status().message());
      return 1;
    }
  }
  // The identity keys (PEM files, the JWKS file, the API keys file) and the
  // secret files (JWT, webhooks) are read and checked as a start would. A
  // secret named by an environment variable that is not set here gets a
  // stand-in that passes every check, and a note: check-config often runs
  // where the secrets are not (a CI job). A jwks_url is not fetched.
  std::set<std::string> unset;
  const EnvLookup env = [&unset](const std::string& name) -> std::optional<std::string> {
    if (auto value = DefaultEnvLookup(name)) return value;
    unset.insert(name);
    // 32 bytes in Standard Webhooks' "whsec_" form: long enough for HS256.
    return std::string("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
  };
  if (auto identity = gateway::IdentityCredentials::Load(config->identity, env); !identity.ok()) {
    PrintLine(stderr, path + ": " + identity.status().message());
    return 1;
  }
  if (auto webhooks = gateway::WebhookEndpoints::Resolve(*config, env); !webhooks.ok()) {
    PrintLine(stderr, path + ": " + webhooks.status().message());
    return 1;
  }
  // The Redis password is read when the store opens, which check-config does
  // not do; an unset variable stops the start as surely.
  if (config->store.kind == config::StoreKind::kRedis && !config->store.redis.password_env.empty()) {
    const std::optional<std::string> password = DefaultEnvLookup(config->store.redis.password_env);
    if (!password || password->empty()) unset.insert(config->store.redis.password_env);
  }
  for (const std::string& name : unset) {
    PrintLine(stderr, path + ": note: the environment variable " + name +
                          " is not set here; the gateway needs it at start");
  }
  for (const std::string& warning : config::ShutdownGraceWarnings(*config)) {
    PrintLine(stderr, path + ": warning: " + warning);
  }
  PrintLine(stdout, path + ": ok");
  return 0;
}

int Run(const Args& args) {
  // Signals are taken by sigwait below; every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto loaded = config::LoadFile(args.config);
  if (!loaded.ok()) {
    PrintLine(stderr, "idemgate: " + loaded.status().message());
    return 1;
  }
  const config::Config& config = *loaded;
  ApplyLogSettings(config);

  auto listen = config::ParseHostPort(config.listen);
  if (!listen.ok()) {
    PrintLine(stderr, "idemgate: listen: " + listen.status().message());
    return 1;
  }
  std::optional<config::HostPort> admin_listen;
  if (!config.admin.listen.empty()) {
    auto a = config::ParseHostPort(config.admin.listen);
    if (!a.ok()) {
      PrintLine(stderr, "idemgate: admin.listen: " + a.status().message());
      return 1;
    }
    admin_listen = *a;
  }

  // The secrets and key files the config names are read before the store
  // opens (the gateway reads them again below), so that a start that fails
  // on one leaves nothing behind, such as a new embedded store's directory.
  if (auto identity = gateway::IdentityCredentials::Load(config.identity, DefaultEnvLookup); !identity.ok()) {
    PrintLine(stderr, "idemgate: " + identity.status().message());
    return 1;
  }
  if (auto webhooks = gateway::WebhookEndpoints::Resolve(config, DefaultEnvLookup); !webhooks.ok()) {
    PrintLine(stderr, "idemgate: " + webhooks.status().message());
    return 1;
  }

  admin::GatewayMetrics metrics(admin::GatewayMetricsOptions{.tenant_labels = config.metrics.tenant_labels});
  auto store = store::MakeStore(config.store, SystemClock::Instance());
  if (!store.ok()) {
    PrintLine(stderr, "idemgate: store: " + store.status().message());
    return 1;
  }
  core::Store* store_ptr = store->get();
  metrics.SetStoreStatsSource([store_ptr] { return store_ptr->Stats(); });
  // identity.jwt.jwks_url: fetched now (a failure stops the start) and on every
  // reload, refreshed in the background meanwhile.
  gateway::JwksRefresher jwks;
  if (Status fetched = jwks.Configure(JwksSettings(config)); !fetched.ok()) {
    PrintLine(stderr, "idemgate: " + fetched.message());
    return 1;
  }
  // Declared before the server so that both outlive every request coroutine.
  core::Engine engine(*store_ptr, SystemClock::Instance());
  gateway::IdentityStage identity(gateway::IdentityStageOptions{.jwks = &jwks});
  gateway::WebhookStage webhook(gateway::WebhookStageOptions{.metrics = &metrics});
  gateway::IdempotencyStage idempotency(
      engine, gateway::IdempotencyStageOptions{.on_error = config.store.on_error, .metrics = &metrics});


  http::ServerOptions server_options;
  server_options.workers = config.workers;
  server_options.limits = gateway::LimitsFromConfig(config);
  WarnIfFewFileDescriptors(config);
  WarnIfShortShutdownGrace(config);
  // Stores may keep per-thread resources on the I/O threads (the Redis store
  // keeps a connection per node there). The store outlives the server.
  server_options.on_worker_start = [store_ptr](boost::asio::io_context& io) { store_ptr->AttachWorker(io); };
  server_options.on_worker_stop = [store_ptr](boost::asio::io_context& io) { store_ptr->DetachWorker(io); };
  http::Server server(server_options);

  gateway::GatewayOptions gateway_options;
  gateway_options.workers = server.worker_count();
  gateway_options.metrics = &metrics;
  gateway_options.idempotency = &idempotency;
  gateway_options.identity = &identity;
  gateway_options.webhook = &webhook;
  auto created = gateway::Gateway::Create(config, gateway_options);
  if (!created.ok()) {
    PrintLine(stderr, "idemgate: " + created.status().message());
    return 1;
  }
  std::unique_ptr<gateway::Gateway> gateway = std::move(*created);

  admin::AdminApi::Options api_options;
  if (!config.admin.token_env.empty()) {
    if (const char* token = std::getenv(config.admin.token_env.c_str())) api_options.token = token;
    // A token that no Authorization header carries intact (white space at
    // its ends is trimmed from the header, control characters are refused)
    // would lock every caller out without a word.
    const std::string& t = api_options.token;
    const bool bad_char = std::any_of(t.begin(), t.end(), [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return u < 0x20 || u == 0x7f;
    });
    if (!t.empty() && (bad_char || t.front() == ' ' || t.back() == ' ')) {
      PrintLine(stderr, "idemgate: admin.token_env: the token in " + config.admin.token_env +
                            " starts or ends with a space or holds a control character, so no Authorization header "
                            "could carry it; fix the variable");
      return 1;
    }
  }
  api_options.metrics = &metrics;
  api_options.stats = &metrics.stats();
  api_options.store = store_ptr;
  admin::AdminApi api(api_options);
  gateway::AdminHandler admin_handler(api, &metrics);

  // TLS on the listen address and on the admin listener: the contexts are
  // read now and again on every reload (a renewed certificate takes effect
  // without a restart).
  http::TlsContextSlot listener_tls;
  http::TlsContextSlot admin_tls;
  for (auto [settings, slot, name] : {std::tuple{&config.tls, &listener_tls, "tls"},
                                      std::tuple{&config.admin.tls, &admin_tls, "admin.tls"}}) {
    if (!settings->configured) continue;
    auto tls = MakeListenerTls(*settings);
    if (!tls.ok()) {
      PrintLine(stderr, std::string("idemgate: ") + name + ": " + tls.status().message());
      return 1;
    }
    slot->Set(std::move(*tls));
  }
  // The admin listener runs on a server of its own (one I/O thread), so that it
  // keeps answering while `server` drains after SIGTERM (/readyz then answers
  // 503 shutting-down, /healthz and /metrics keep working, on new and on
  // keep-alive connections); it stops once the data path has drained. Its
  // thread is not announced to the store: admin calls use the store's own
  // connections (the Redis store's owned client), not a worker's.
  http::ServerOptions admin_server_options;
  admin_server_options.workers = 1;
  admin_server_options.limits = AdminLimits(config);
  http::Server admin_server(admin_server_options);
  auto bound = server.Listen(listen->host, listen->port, *gateway, /*all_workers=*/true,
                             config.tls.configured ? &listener_tls : nullptr);
  if (!bound.ok()) {
    PrintLine(stderr, "idemgate: " + bound.status().message());
    return 1;
  }
  std::optional<http::BoundAddress> admin_bound;
  if (admin_listen) {
    auto a = admin_server.Listen(admin_listen->host, admin_listen->port, admin_handler, /*all_workers=*/false,
                                 config.admin.tls.configured ? &admin_tls : nullptr);
    if (!a.ok()) {
      PrintLine(stderr, "idemgate: admin: " + a.status().message());
      return 1;
    }
    admin_bound = *a;
  }

  server.Start();
  if (admin_bound) admin_server.Start();
  LogInfo("listening", {{"listen", bound->ToString()},
                        {"admin", admin_bound ? std::optional<std::string_view>(admin_bound->ToString())
                                              : std::nullopt},
                        {"workers", static_cast<std::uint64_t>(server.worker_count())},
                        {"version", kVersion},
                        {"config", config.source}});
  if (!args.ready_file.empty()) {
    std::string ready = "listen=" + bound->ToString() + "\n";
    if (admin_bound) ready += "admin=" + admin_bound->ToString() + "\n";
    Status written = WriteFileAtomically(args.ready_file, ready);
    if (!written.ok()) LogError("cannot write the ready file", {{"error", written.message()}});
  }

  Duration grace = config.shutdown_grace;
  // The config the gateway serves now (`config` stays the start-up one: the
  // settings that need a restart are compared with it).
  config::Config running = config;
  for (;;) {
    int sig = 0;
    if (sigwait(&signals, &sig) != 0) continue;
    if (sig == SIGHUP) {
      auto reloaded = config::LoadFile(args.config);
      if (!reloaded.ok()) {
        LogError("config reload failed; keeping the running config", {{"error", reloaded.status().message()}});
        continue;
      }
      // The listeners' certificates, read again (a listener without TLS at
      // start stays without it: that needs a restart).
      std::shared_ptr<const http::TlsContext> new_tls;
      std::shared_ptr<const http::TlsContext> new_admin_tls;
      bool tls_failed = false;
      for (auto [running, wanted, out, name] :
           {std::tuple{&config.tls, &reloaded->tls, &new_tls, "tls"},
            std::tuple{&config.admin.tls, &reloaded->admin.tls, &new_admin_tls, "admin.tls"}}) {
        if (!running->configured || !wanted->configured || tls_failed) continue;
        auto tls = MakeListenerTls(*wanted);
        if (!tls.ok()) {
          LogError("config reload failed; keeping the running config",
                   {{"error", std::string(name) + ": " + tls.status().message()}});
          tls_failed = true;
          continue;
        }
        *out = std::move(*tls);
      }
      if (tls_failed) continue;
      // A new jwks_url (or its settings) is fetched before anything changes.
      Status fetched = jwks.Configure(JwksSettings(*reloaded));
      if (!fetched.ok()) {
        LogError("config reload failed; keeping the running config", {{"error", fetched.message()}});
        continue;
      }
      Status applied = gateway->Reload(*reloaded);
      if (!applied.ok()) {
        jwks.Revert();  // back to the running config's JWKS
        LogError("config reload failed; keeping the running config", {{"error", applied.message()}});
        continue;
      }
      if (new_tls) listener_tls.Set(std::move(new_tls));
      if (new_admin_tls) admin_tls.Set(std::move(new_admin_tls));
      server.SetLimits(gateway::LimitsFromConfig(*reloaded));
      admin_server.SetLimits(AdminLimits(*reloaded));
      WarnIfFewFileDescriptors(*reloaded);
      WarnIfShortShutdownGrace(*reloaded);
      ApplyLogSettings(*reloaded);
      grace = reloaded->shutdown_grace;
      if (reloaded->listen != config.listen || reloaded->workers != config.workers ||
          reloaded->admin.listen != config.admin.listen || reloaded->tls.configured != config.tls.configured ||
          reloaded->admin.tls.configured != config.admin.tls.configured) {
        LogWarn("listen, tls or admin.tls on or off, admin.listen and workers changes need a restart");
      }
      if (reloaded->admin.token_env != config.admin.token_env) {
        LogWarn("admin.token_env changes need a restart; the admin API keeps the token it read at start",
                {{"token_env", config.admin.token_env}});
      }
      if (reloaded->metrics.tenant_labels != config.metrics.tenant_labels) {
        LogWarn("metrics.tenant_labels changes need a restart; the metrics keep their start-up labels");
      }
      if (!(reloaded->store == config.store)) {
        LogWarn("store changes (kind, path, sync, max_bytes, on_error, redis) need a restart; the running store "
                "and its settings are kept");
      }
      // Taken as written (it may be meant), but said: retries of requests
      // stored before no longer reach their records.
      for (const std::string& change : config::StoredKeyChanges(running, *reloaded)) {
        LogWarn("config reload leaves stored keys behind", {{"change", change}});
      }
      running = std::move(*reloaded);
      LogInfo("config reloaded", {{"config", args.config}});
      continue;
    }
    LogInfo("stopping", {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"},
                         {"shutdown_grace_ms", static_cast<std::int64_t>(grace.count())}});
    break;
  }

  // The data path drains first while the admin listener keeps serving (/readyz
  // says shutting-down); then the admin listener stops. A second SIGTERM or
  // SIGINT meanwhile ends the grace at once: what is still running is cut
  // and its reservations released, as at the end of the grace (the faster
  // way out that kill -9 is not: that leaves keys reserved until their
  // leases end).
  api.SetDraining(true);
  std::atomic<bool> drained{false};
  std::atomic<bool> cut{false};
  std::thread second_signal([&] {
    while (!drained.load()) {
      const timespec tick{0, 50'000'000};
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if ((sig != SIGTERM && sig != SIGINT) || cut.exchange(true)) continue;
      LogWarn("second signal: ending the shutdown grace now; requests still running are cut and their "
              "reservations released",
              {{"signal", sig == SIGINT ? "SIGINT" : "SIGTERM"}});
      server.EndGrace();
      admin_server.EndGrace();
    }
  });
  const bool clean = server.Stop(grace);
  admin_server.Stop(cut.load() ? Duration::zero() : std::min(grace, kAdminStopGrace));
  drained.store(true);
  second_signal.join();
  // What the shutdown gave up: /metrics is gone by now, so the count of
  // idempotency_reservation_released_total{reason="shutdown"} is logged.
  LogInfo("reservations released at shutdown",
          {{"released", metrics.shutdown_releases()},
           {"reason", "shutdown"},
           {"grace", clean ? "drained" : (cut.load() ? "ended_by_second_signal" : "over")}});
  gateway->ClosePools();
  LogInfo("stopped", {{"clean", clean}});
  return 0;
}

}  // namespace
}  // namespace idemgate::cli

int main(int argc, char** argv) {
  using idemgate::cli::Args;
  std::string error;
  auto args = idemgate::cli::ParseArgs(argc, argv, &error);
  if (!args) {
    idemgate::cli::PrintLine(stderr, "idemgate: " + error);
    idemgate::cli::Print(stderr, "\n");
    idemgate::cli::Print(stderr, idemgate::cli::kUsage);
    return 2;
  }
  switch (args->mode) {
    case Args::Mode::kHelp: idemgate::cli::Print(stdout, idemgate::cli::kUsage); return 0;
    case Args::Mode::kCheckHelp: idemgate::cli::Print(stdout, idemgate::cli::kCheckConfigUsage); return 0;
    case Args::Mode::kVersion:
      idemgate::cli::Print(stdout, "idemgate " + std::string(idemgate::cli::kVersion) + "\n");
      return 0;
    case Args::Mode::kCheck: return idemgate::cli::CheckConfig(args->config);
    case Args::Mode::kRun: break;
  }
  try {
    return idemgate::cli::Run(*args);
  } catch (const std::exception& e) {
    idemgate::cli::PrintLine(stderr, std::string("idemgate: ") + e.what());
    return 1;
  }
}
