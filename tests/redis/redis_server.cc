#include "tests/redis/redis_server.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace idemgate::store::redis::testing {
namespace {

using namespace std::chrono_literals;

bool OnPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

// fork + exec with stdout/stderr appended to `log`. The child dies with us.
pid_t Spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const std::string log_path = log.string();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, 0);
    const int out = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Reply Convert(const redisReply* r) {
  switch (r->type) {
    case REDIS_REPLY_STRING: return Reply::String(std::string(r->str, r->len));
    case REDIS_REPLY_STATUS: return Reply::StatusReply(std::string(r->str, r->len));
    case REDIS_REPLY_ERROR: return Reply::Error(std::string(r->str, r->len));
    case REDIS_REPLY_INTEGER: return Reply::Integer(r->integer);
    case REDIS_REPLY_ARRAY: {
      std::vector<Reply> elements;
      for (size_t i = 0; i < r->elements; ++i) elements.push_back(Convert(r->element[i]));
      return Reply::Array(std::move(elements));
    }
    default: return Reply::Nil();
  }
}

bool IsOk(const Reply& r) { return r.type == Reply::Type::kStatus && r.str == "OK"; }

}  // namespace

bool RedisInstalled() {
  static const bool installed = OnPath("redis-server") && OnPath("redis-cli");
  return installed;
}

int PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

int RunProgram(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
               const std::filesystem::path& log) {
  const pid_t pid = Spawn(argv, log);
  if (pid < 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(20ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

RedisServer::RedisServer() : RedisServer(Options{}) {}

RedisServer::RedisServer(Options options) : options_(std::move(options)) {
  std::string templ = (std::filesystem::temp_directory_path() / "idemgate-redis-XXXXXX").string();
  if (::mkdtemp(templ.data()) != nullptr) dir_ = templ;
}

RedisServer::~RedisServer() {
  Kill();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

::testing::AssertionResult RedisServer::Start() {
  if (dir_.empty()) return ::testing::AssertionFailure() << "mkdtemp failed";
  if (running()) return ::testing::AssertionSuccess();
  if (port_ == 0) {
    port_ = PickFreePort();
    do bus_port_ = PickFreePort();
    while (bus_port_ == port_);
  }
  std::vector<std::string> argv = {"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--daemonize", "no",
                                   "--dir", dir_.string(), "--logfile", ""};
  if (!options_.password.empty()) {
    argv.insert(argv.end(), {"--requirepass", options_.password});
  }
  if (options_.cluster) {
    argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                             (dir_ / ("nodes-" + std::to_string(port_) + ".conf")).string(), "--cluster-port",
                             std::to_string(bus_port_), "--cluster-node-timeout", "5000"});
  }
  argv.insert(argv.end(), options_.extra.begin(), options_.extra.end());
  const auto log = dir_ / "redis.log";
  pid_ = Spawn(argv, log);
  if (pid_ < 0) return ::testing::AssertionFailure() << "fork failed";
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return ::testing::AssertionFailure() << "redis-server exited; log:\n" << ReadFile(log);
    }
    Reply pong = Run({"PING"});
    if (pong.type == Reply::Type::kStatus && pong.str == "PONG") return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(20ms);
  }
  Kill();
  return ::testing::AssertionFailure() << "redis-server did not answer PING; log:\n" << ReadFile(log);
}

void RedisServer::Kill() {
  Disconnect();
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

void RedisServer::Pause() {
  Disconnect();
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void RedisServer::Resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

void RedisServer::Disconnect() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

Reply RedisServer::Run(const std::vector<std::string>& args) {
  if (ctx_ == nullptr) {
    timeval connect_timeout{1, 0};
    ctx_ = redisConnectWithTimeout("127.0.0.1", port_, connect_timeout);
    if (ctx_ == nullptr || ctx_->err != 0) {
      std::string why = ctx_ != nullptr ? ctx_->errstr : "out of memory";
      Disconnect();
      return Reply::Error("TRANSPORT connect: " + why);
    }
    timeval io_timeout{10, 0};
    redisSetTimeout(ctx_, io_timeout);
    if (!options_.password.empty()) {
      Reply auth = Run({"AUTH", options_.password});
      if (!IsOk(auth)) return auth;
    }
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()));
  if (r == nullptr) {
    std::string why = ctx_->errstr;
    Disconnect();
    return Reply::Error("TRANSPORT " + why);
  }
  Reply out = Convert(r);
  freeReplyObject(r);
  return out;
}

RedisCluster::RedisCluster(int masters, int spares) {
  RedisServer::Options o;
  o.cluster = true;
  o.extra = {"--repl-diskless-sync-delay", "0"};  // a replica (AddReplica) syncs at once
  for (int i = 0; i < masters; ++i) nodes_.push_back(std::make_unique<RedisServer>(o));
  for (int i = 0; i < spares; ++i) spares_.push_back(std::make_unique<RedisServer>(o));
}

RedisCluster::~RedisCluster() = default;

std::vector<std::string> RedisCluster::addresses() const {
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->address());
  return out;
}

::testing::AssertionResult RedisCluster::Start() {
  for (auto* group : {&nodes_, &spares_}) {
    for (auto& n : *group) {
      auto started = n->Start();
      if (!started) return started;
    }
  }
  std::vector<std::string> argv = {"redis-cli", "--cluster", "create"};
  for (auto& a : addresses()) argv.push_back(a);
  argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  const auto log = std::filesystem::temp_directory_path() /
                   ("idemgate-cluster-create-" + std::to_string(::getpid()) + ".log");
  const int rc = RunProgram(argv, 60s, log);
  const std::string output = ReadFile(log);
  std::filesystem::remove(log);
  if (rc != 0) return ::testing::AssertionFailure() << "redis-cli --cluster create failed:\n" << output;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool ready = true;
    for (auto& n : nodes_) {
      Reply info = n->Run({"CLUSTER", "INFO"});
      Reply slots = n->Run({"CLUSTER", "SLOTS"});
      if (info.str.find("cluster_state:ok") == std::string::npos ||
          slots.elements.size() != nodes_.size()) {
        ready = false;
      }
    }
    if (ready) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(50ms);
  }
  return ::testing::AssertionFailure() << "cluster did not reach cluster_state:ok";
}

std::string RedisCluster::NodeId(int i) { return node(i).Run({"CLUSTER", "MYID"}).str; }

int RedisCluster::OwnerOf(int slot) {
  Reply slots = node(0).Run({"CLUSTER", "SLOTS"});
  for (const Reply& range : slots.elements) {
    if (range.elements.size() < 3) continue;
    if (slot < range.elements[0].integer || slot > range.elements[1].integer) continue;
    const auto port = range.elements[2].elements.at(1).integer;
    for (int i = 0; i < size(); ++i) {
      if (node(i).port() == port) return i;
    }
  }
  return -1;
}

::testing::AssertionResult RedisCluster::BeginMigration(int slot, int from, int to,
                                                        const std::vector<std::string>& keys) {
  const std::string s = std::to_string(slot);
  Reply r = node(to).Run({"CLUSTER", "SETSLOT", s, "IMPORTING", NodeId(from)});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "IMPORTING: " << r.DebugString();
  r = node(from).Run({"CLUSTER", "SETSLOT", s, "MIGRATING", NodeId(to)});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "MIGRATING: " << r.DebugString();
  for (const auto& key : keys) {
    r = node(from).Run({"MIGRATE", "127.0.0.1", std::to_string(node(to).port()), key, "0", "5000"});
    if (!IsOk(r) && r.str != "NOKEY") return ::testing::AssertionFailure() << "MIGRATE: " << r.DebugString();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult RedisCluster::FinishMigration(int slot, int from, int to) {
  const std::string s = std::to_string(slot);
  for (;;) {
    Reply keys = node(from).Run({"CLUSTER", "GETKEYSINSLOT", s, "100"});
    if (keys.type != Reply::Type::kArray) {
      return ::testing::AssertionFailure() << "GETKEYSINSLOT: " << keys.DebugString();
    }
    if (keys.elements.empty()) break;
    std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(node(to).port()), "", "0", "5000",
                                        "KEYS"};
    for (const Reply& k : keys.elements) migrate.push_back(k.str);
    Reply r = node(from).Run(migrate);
    if (!IsOk(r)) return ::testing::AssertionFailure() << "MIGRATE: " << r.DebugString();
  }
  const std::string to_id = NodeId(to);
  // The new owner first, then the old one, then the rest (as redis-cli does).
  std::vector<int> order = {to, from};
  for (int i = 0; i < size(); ++i) {
    if (i != to && i != from) order.push_back(i);
  }
  for (int i : order) {
    Reply r = node(i).Run({"CLUSTER", "SETSLOT", s, "NODE", to_id});
    if (!IsOk(r)) return ::testing::AssertionFailure() << "SETSLOT NODE on " << i << ": " << r.DebugString();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult RedisCluster::RemoveNode(int from, int to) {
  const std::string from_id = NodeId(from);
  const std::string to_id = NodeId(to);
  std::vector<int> others;
  for (int i = 0; i < size(); ++i) {
    if (i != from && i != to && std::find(removed_.begin(), removed_.end(), i) == removed_.end()) {
      others.push_back(i);
    }
  }
  Reply slots = node(from).Run({"CLUSTER", "SLOTS"});
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const Reply& range : slots.elements) {
    if (range.elements.size() < 3 || range.elements[2].elements.size() < 2) continue;
    if (range.elements[2].elements[1].integer != node(from).port()) continue;
    ranges.emplace_back(range.elements[0].integer, range.elements[1].integer);
  }
  for (const auto& [first, last] : ranges) {
    for (std::int64_t slot = first; slot <= last; ++slot) {
      const std::string s = std::to_string(slot);
      Reply r = node(to).Run({"CLUSTER", "SETSLOT", s, "IMPORTING", from_id});
      if (!IsOk(r)) return ::testing::AssertionFailure() << "IMPORTING " << s << ": " << r.DebugString();
      r = node(from).Run({"CLUSTER", "SETSLOT", s, "MIGRATING", to_id});
      if (!IsOk(r)) return ::testing::AssertionFailure() << "MIGRATING " << s << ": " << r.DebugString();
      for (;;) {
        Reply keys = node(from).Run({"CLUSTER", "GETKEYSINSLOT", s, "100"});
        if (keys.type != Reply::Type::kArray) {
          return ::testing::AssertionFailure() << "GETKEYSINSLOT: " << keys.DebugString();
        }
        if (keys.elements.empty()) break;
        std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(node(to).port()), "", "0",
                                            "5000", "KEYS"};
        for (const Reply& k : keys.elements) migrate.push_back(k.str);
        r = node(from).Run(migrate);
        if (!IsOk(r)) return ::testing::AssertionFailure() << "MIGRATE: " << r.DebugString();
      }
      std::vector<int> order = {to, from};
      order.insert(order.end(), others.begin(), others.end());
      for (int i : order) {
        r = node(i).Run({"CLUSTER", "SETSLOT", s, "NODE", to_id});
        // Having lost its last slot, `from` may already have turned into a
        // replica of `to` (cluster-allow-replica-migration).
        if (i == from && r.str.find("only with masters") != std::string::npos) continue;
        if (!IsOk(r)) return ::testing::AssertionFailure() << "SETSLOT NODE on " << i << ": " << r.DebugString();
      }
    }
  }
  std::vector<int> remaining = {to};
  remaining.insert(remaining.end(), others.begin(), others.end());
  for (int i : remaining) {
    Reply r = node(i).Run({"CLUSTER", "FORGET", from_id});
    if (!IsOk(r)) return ::testing::AssertionFailure() << "FORGET on " << i << ": " << r.DebugString();
  }
  Reply r = node(from).Run({"CLUSTER", "RESET", "SOFT"});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "RESET: " << r.DebugString();
  removed_.push_back(from);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool ready = node(from).Run({"CLUSTER", "SLOTS"}).elements.empty();
    for (int i : remaining) {
      Reply info = node(i).Run({"CLUSTER", "INFO"});
      Reply map = node(i).Run({"CLUSTER", "SLOTS"});
      std::int64_t served = 0;
      for (const Reply& range : map.elements) {
        if (range.elements.size() < 3 || range.elements[2].elements.size() < 2) continue;
        if (range.elements[2].elements[1].integer == node(from).port()) ready = false;
        served += range.elements[1].integer - range.elements[0].integer + 1;
      }
      if (info.str.find("cluster_state:ok") == std::string::npos || served != 16384) ready = false;
    }
    if (ready) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(50ms);
  }
  return ::testing::AssertionFailure() << "the remaining nodes did not agree on the map after removing " << from;
}

::testing::AssertionResult RedisCluster::AddNode(int spare) {
  if (spare < 0 || static_cast<std::size_t>(spare) >= spares_.size() ||
      spares_[static_cast<std::size_t>(spare)] == nullptr) {
    return ::testing::AssertionFailure() << "no spare " << spare;
  }
  RedisServer& added = *spares_[static_cast<std::size_t>(spare)];
  Reply r = node(0).Run({"CLUSTER", "MEET", "127.0.0.1", std::to_string(added.port()),
                                 std::to_string(added.bus_port())});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "MEET: " << r.DebugString();
  const std::string id = added.Run({"CLUSTER", "MYID"}).str;
  nodes_.push_back(std::move(spares_[static_cast<std::size_t>(spare)]));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool ready = true;
    for (auto& n : nodes_) {
      // Every node lists every other, handshakes done, and is up.
      const std::string nodes = n->Run({"CLUSTER", "NODES"}).str;
      if (n->Run({"CLUSTER", "INFO"}).str.find("cluster_state:ok") == std::string::npos ||
          nodes.find(id) == std::string::npos || nodes.find("handshake") != std::string::npos ||
          static_cast<std::size_t>(std::count(nodes.begin(), nodes.end(), '\n')) != nodes_.size()) {
        ready = false;
      }
    }
    if (ready) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(50ms);
  }
  return ::testing::AssertionFailure() << "the cluster did not learn the added node";
}

::testing::AssertionResult RedisCluster::AddReplica(int spare, int master) {
  auto added = AddNode(spare);
  if (!added) return added;
  const std::string master_id = NodeId(master);
  RedisServer& replica = node(size() - 1);
  Reply r = replica.Run({"CLUSTER", "REPLICATE", master_id});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "REPLICATE: " << r.DebugString();
  const std::string online = "port=" + std::to_string(replica.port()) + ",state=online";
  const std::string replica_of = "slave " + master_id;
  const std::string replica_id = NodeId(size() - 1);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    // Synced, and known as a replica by every node (or the masters would
    // refuse it their votes in a failover).
    bool ready = node(master).Run({"INFO", "replication"}).str.find(online) != std::string::npos;
    for (auto& n : nodes_) {
      const std::string nodes = n->Run({"CLUSTER", "NODES"}).str;
      const auto line = nodes.find(replica_id);
      if (line == std::string::npos || nodes.substr(line, nodes.find('\n', line) - line).find(replica_of) ==
                                           std::string::npos) {
        ready = false;
      }
    }
    if (ready) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(50ms);
  }
  return ::testing::AssertionFailure() << "the replica did not come online";
}

::testing::AssertionResult RedisCluster::Failover(int replica) {
  Reply r = node(replica).Run({"CLUSTER", "FAILOVER"});
  if (!IsOk(r)) return ::testing::AssertionFailure() << "FAILOVER: " << r.DebugString();
  const auto port = node(replica).port();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    bool ready = true;
    for (auto& n : nodes_) {
      bool named = false;
      for (const Reply& range : n->Run({"CLUSTER", "SLOTS"}).elements) {
        if (range.elements.size() >= 3 && range.elements[2].elements.size() >= 2 &&
            range.elements[2].elements[1].integer == port) {
          named = true;
        }
      }
      if (!named) ready = false;
    }
    if (ready) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(50ms);
  }
  return ::testing::AssertionFailure() << "the cluster did not take node " << replica << " as a master:\n"
                                       << node(replica).Run({"CLUSTER", "NODES"}).str;
}

::testing::AssertionResult RedisCluster::MigrateSlot(int slot, int from, int to) {
  auto begun = BeginMigration(slot, from, to, {});
  if (!begun) return begun;
  return FinishMigration(slot, from, to);
}

}  // namespace idemgate::store::redis::testing
