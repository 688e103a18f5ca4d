#include "fakes/testing.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "common/tls_peer.h"

extern char** environ;

namespace idemgate::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

using SteadyClock = std::chrono::steady_clock;

std::string ErrnoText(std::string_view what) {
  return std::string(what) + ": " + std::strerror(errno);
}


int MillisLeft(SteadyClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Millis>(deadline - SteadyClock::now()).count();
  return left < 0 ? 0
                  : static_cast<int>(std::min<long long>(left, std::numeric_limits<int>::max()));
}

}  // namespace

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Files

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/idemgate-test-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    std::perror("TempDir: mkdtemp");
    std::abort();
  }
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Join(std::string_view name) const { return path_ + "/" + std::string(name); }

Status WriteFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return UnavailableError("cannot open " + path);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out.flush()) return UnavailableError("cannot write " + path);
  return Status::Ok();
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string ReadFileOrEmpty(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : std::string();
}

StatusOr<std::string> WriteConfig(const TempDir& dir, std::string_view yaml,
                                  std::string_view name) {
  std::string path = dir.Join(name);
  if (Status s = WriteFile(path, yaml); !s.ok()) return s;
  return path;
}

bool PollUntil(const std::function<bool()>& done, Millis timeout, Millis interval) {
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (SteadyClock::now() >= deadline) return done();
    std::this_thread::sleep_for(interval);
  }
}

// ---------------------------------------------------------------------------
// Processes

std::string ExitStatus::ToString() const {
  return exited ? "exit " + std::to_string(code) : "signal " + std::to_string(signal);
}

StatusOr<Process> Process::Start(const std::string& exe, const std::vector<std::string>& args,
                                 const ProcessOptions& options) {
  // Everything the child needs is prepared before fork: between fork and exec
  // only async-signal-safe calls are allowed.
  std::vector<std::string> argv_storage;
  argv_storage.push_back(exe);
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_storage;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [k, v] : options.env) overridden = overridden || k == name;
    if (!overridden) env_storage.emplace_back(entry);
  }
  for (const auto& [k, v] : options.env) env_storage.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) return InternalError(ErrnoText("pipe2"));
  const pid_t parent = ::getpid();
  const char* out_path = options.stdout_path.empty() ? nullptr : options.stdout_path.c_str();
  const char* err_path = options.stderr_path.empty() ? nullptr : options.stderr_path.c_str();

  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    return InternalError(ErrnoText("fork"));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    if (out_path) {
      const int fd = ::open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) ::dup2(fd, 1);
    }
    if (err_path) {
      const int fd = ::open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
    }
    // No other descriptor of the test (sockets, files) leaks into the child.
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
      for (int fd = 3; fd < 4096; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    ::execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    [[maybe_unused]] ssize_t w = ::write(exec_pipe[1], &err, sizeof err);
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  Process process(pid);
  if (n > 0) {
    process.Reap(true);
    return UnavailableError("cannot exec " + exe + ": " + std::strerror(child_errno));
  }
  return process;
}

Process::Process(Process&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), exit_status_(std::move(other.exit_status_)) {}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = std::exchange(other.pid_, -1);
    exit_status_ = std::move(other.exit_status_);
  }
  return *this;
}

Process::~Process() { Kill(); }

bool Process::Reap(bool block) {
  if (pid_ <= 0 || exit_status_) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  ExitStatus es;
  if (r < 0) {
    es.code = -1;  // not our child any more (should not happen)
  } else if (WIFEXITED(status)) {
    es.exited = true;
    es.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    es.signal = WTERMSIG(status);
  }
  exit_status_ = es;
  return true;
}

bool Process::Running() { return pid_ > 0 && !Reap(false); }

Status Process::Signal(int sig) {
  if (!Running()) return FailedPreconditionError("process is not running");
  if (::kill(pid_, sig) != 0) return InternalError(ErrnoText("kill"));
  return Status::Ok();
}

std::optional<ExitStatus> Process::WaitExit(Millis timeout) {
  if (pid_ <= 0) return exit_status_;
  PollUntil([this] { return Reap(false); }, timeout, 5ms);
  return exit_status_;
}

void Process::Kill() {
  if (pid_ <= 0 || exit_status_) return;
  if (Reap(false)) return;
  ::kill(pid_, SIGKILL);
  Reap(true);
}

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

StatusOr<HostPort> ParseHostPort(std::string_view text) {
  HostPort hp;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find("]:");
    if (close == std::string_view::npos)
      return InvalidArgumentError("bad address: " + std::string(text));
    hp.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgumentError("bad address: " + std::string(text));
    }
    hp.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  unsigned port = 0;
  const auto [ptr, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port_text.empty() ||
      port > 65535) {
    return InvalidArgumentError("bad port in " + std::string(text));
  }
  hp.port = static_cast<std::uint16_t>(port);
  return hp;
}

StatusOr<ReadyInfo> WaitForReadyFile(const std::string& path, Millis timeout, Process* process) {
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    auto text = ReadFile(path);
    if (text.ok() && !text->empty() && text->back() == '\n') {
      ReadyInfo info;
      std::istringstream lines(*text);
      std::string line;
      while (std::getline(lines, line)) {
        const auto eq = line.find('=');
        if (eq == std::string::npos) continue;
        info[line.substr(0, eq)] = line.substr(eq + 1);
      }
      return info;
    }
    if (process && !process->Running()) {
      return UnavailableError("process exited (" + process->exit_status()->ToString() +
                              ") before writing " + path);
    }
    if (SteadyClock::now() >= deadline) {
      return DeadlineExceededError("no ready file " + path + " after " +
                                   std::to_string(timeout.count()) + "ms");
    }
    std::this_thread::sleep_for(10ms);
  }
}

StatusOr<HostPort> Server::Endpoint(const std::string& key) const {
  auto it = ready.find(key);
  if (it == ready.end()) return NotFoundError("no '" + key + "' in the ready file");
  return ParseHostPort(it->second);
}

StatusOr<Server> StartServer(const std::string& exe, std::vector<std::string> args,
                             const std::string& ready_file, const ProcessOptions& options,
                             Millis timeout) {
  std::error_code ec;
  std::filesystem::remove(ready_file, ec);
  args.push_back("--ready-file");
  args.push_back(ready_file);
  auto process = Process::Start(exe, args, options);
  if (!process.ok()) return process.status();
  auto ready = WaitForReadyFile(ready_file, timeout, &*process);
  if (!ready.ok()) {
    process->Kill();
    return Status(ready.status().code(), exe + ": " + ready.status().message());
  }
  return Server{std::move(*process), std::move(*ready)};
}

StatusOr<RefusedPort> RefusedPort::Make() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return InternalError(ErrnoText("socket"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Status s = InternalError(ErrnoText("bind"));
    ::close(fd);
    return s;
  }
  return RefusedPort(fd, static_cast<std::uint16_t>(ntohs(addr.sin_port)));
}

RefusedPort::~RefusedPort() { Close(); }

StatusOr<std::uint16_t> PickFreePort() {
  // Bound to port 0, then closed: free again, for a server to take.
  StatusOr<RefusedPort> held = RefusedPort::Make();
  if (!held.ok()) return held.status();
  return held->port();
}

void RefusedPort::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

StatusOr<std::uint64_t> ProcStatusKiB(pid_t pid, std::string_view field) {
  auto text = ReadFile("/proc/" + std::to_string(pid) + "/status");
  if (!text.ok()) return text.status();
  std::istringstream lines(*text);
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(lines, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::istringstream rest(line.substr(prefix.size()));
    std::uint64_t value = 0;
    if (rest >> value) return value;
    return InternalError("cannot parse " + line);
  }
  return NotFoundError("no " + std::string(field) + " in /proc/" + std::to_string(pid) + "/status");
}

// ---------------------------------------------------------------------------
// HTTP

std::optional<std::string> HttpResponse::Header(std::string_view name) const {
  for (const auto& h : headers) {
    if (IEquals(h.name, name)) return h.value;
  }
  return std::nullopt;
}

std::vector<std::string> HttpResponse::Headers(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& h : headers) {
    if (IEquals(h.name, name)) out.push_back(h.value);
  }
  return out;
}

std::vector<HeaderField> ParseHeaderBlock(std::string_view block) {
  std::vector<HeaderField> fields;
  bool start_line = true;
  while (!block.empty()) {
    const auto eol = block.find("\r\n");
    const std::string_view line = block.substr(0, eol);
    block.remove_prefix(eol == std::string_view::npos ? block.size() : eol + 2);
    if (line.empty() && start_line) continue;  // CRLFs before a message are allowed
    if (line.empty()) break;                   // end of the header block
    if (std::exchange(start_line, false)) continue;
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    fields.push_back({std::string(line.substr(0, colon)), std::string(value)});
  }
  return fields;
}

namespace {

bool HasField(const std::vector<HeaderField>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (IEquals(h.name, name)) return true;
  }
  return false;
}

// True when a Transfer-Encoding line asks for chunked coding.
bool SendsChunked(const std::vector<HeaderField>& headers) {
  for (const auto& h : headers) {
    if (!IEquals(h.name, "Transfer-Encoding")) continue;
    std::string lower;
    for (char c : h.value) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("chunked") != std::string::npos) return true;
  }
  return false;
}

// The request line and header block, exactly as given plus Host and
// Content-Length when absent (HttpRequest's contract).
std::string RequestHead(const HttpRequest& request, const HostPort& endpoint,
                        std::uint64_t body_length) {
  std::string head = request.method + " " + request.target + " HTTP/1.1\r\n";
  if (!HasField(request.headers, "Host")) head += "Host: " + endpoint.ToString() + "\r\n";
  for (const auto& h : request.headers) head += h.name + ": " + h.value + "\r\n";
  const bool method_has_body =
      request.method == "POST" || request.method == "PUT" || request.method == "PATCH";
  if (!HasField(request.headers, "Content-Length") &&
      !HasField(request.headers, "Transfer-Encoding") && (body_length > 0 || method_has_body)) {
    head += "Content-Length: " + std::to_string(body_length) + "\r\n";
  }
  head += "\r\n";
  return head;
}

// `data` framed as one chunk ("" for an empty piece, which would end the body).
std::string Chunk(std::string_view data) {
  if (data.empty()) return {};
  char size_line[32];
  const int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
  std::string out(size_line, static_cast<std::size_t>(n));
  out += data;
  out += "\r\n";
  return out;
}

constexpr std::string_view kLastChunk = "0\r\n\r\n";

std::string_view BufferView(const beast::flat_buffer& buffer) {
  return {static_cast<const char*>(buffer.data().data()), buffer.size()};
}

// Status, reason, body and keep-alive from Beast's parse; header lines in
// wire order from the raw block (Beast's container groups same-name lines).
HttpResponse ToResponse(const http::response<http::string_body>& res,
                        std::vector<HeaderField> wire_headers) {
  HttpResponse out;
  out.status = static_cast<int>(res.result_int());
  out.reason = std::string(res.reason());
  out.headers = std::move(wire_headers);
  out.body = res.body();
  out.keep_alive = res.keep_alive();
  return out;
}

constexpr std::size_t kMaxResponseHeader = 1024 * 1024;

}  // namespace

struct HttpClient::Impl {
  HostPort endpoint;
  Millis timeout;
  asio::io_context ioc;
  tcp::socket socket{ioc};
  beast::flat_buffer buffer;
  int opened = 0;

  // Starts one asynchronous operation via `start(handler)` and runs it to
  // completion or until `timeout`, when the socket is closed to cancel it.
  template <typename Start>
  beast::error_code Run(Start&& start) {
    std::optional<beast::error_code> result;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run_for(timeout);
    if (!result) {
      beast::error_code ignored;
      socket.close(ignored);
      ioc.restart();
      ioc.run();
      return asio::error::timed_out;
    }
    return *result;
  }

  void Close() {
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    buffer.clear();
  }

  Status Fail(std::string_view what, beast::error_code ec) {
    Close();
    const std::string msg = std::string(what) + ": " + ec.message();
    if (ec == asio::error::timed_out) return DeadlineExceededError(msg);
    return UnavailableError(msg);
  }

  Status Connect() {
    beast::error_code ec;
    std::vector<tcp::endpoint> endpoints;
    const auto address = asio::ip::make_address(endpoint.host, ec);
    if (!ec) {
      endpoints.emplace_back(address, endpoint.port);
    } else {
      tcp::resolver resolver(ioc);
      auto results = resolver.resolve(endpoint.host, std::to_string(endpoint.port), ec);
      if (ec) return UnavailableError("resolve " + endpoint.host + ": " + ec.message());
      for (const auto& r : results) endpoints.push_back(r.endpoint());
    }
    socket = tcp::socket(ioc);
    buffer.clear();
    ec = Run([&](auto handler) {
      asio::async_connect(
          socket, endpoints,
          [h = std::move(handler)](beast::error_code e, const tcp::endpoint&) mutable { h(e); });
    });
    if (ec) return Fail("connect " + endpoint.ToString(), ec);
    socket.set_option(tcp::no_delay(true), ec);
    ++opened;
    return Status::Ok();
  }

  beast::error_code WriteAll(std::string_view bytes) {
    return Run([&](auto handler) {
      asio::async_write(socket, asio::buffer(bytes.data(), bytes.size()), std::move(handler));
    });
  }

  Status WriteRequest(const HttpRequest& request) {
    const bool chunked = SendsChunked(request.headers);
    const std::uint64_t length = request.stream ? request.stream_length : request.body.size();
    std::string head = RequestHead(request, endpoint, length);
    if (!request.stream) {
      // Head and body in one write, as most clients do.
      if (chunked) {
        for (std::size_t off = 0; off < request.body.size(); off += 64 * 1024) {
          head += Chunk(std::string_view(request.body).substr(off, 64 * 1024));
        }
        head += kLastChunk;
      } else {
        head += request.body;
      }
      if (auto ec = WriteAll(head)) return Fail("write request", ec);
      return Status::Ok();
    }
    if (auto ec = WriteAll(head)) return Fail("write header", ec);
    std::vector<char> piece(256 * 1024);
    std::uint64_t sent = 0;
    for (;;) {
      const std::size_t n = request.stream(piece.data(), piece.size());
      if (n == 0) break;
      const std::string_view data(piece.data(), n);
      const auto ec = chunked ? WriteAll(Chunk(data)) : WriteAll(data);
      if (ec) return Fail("write body", ec);
      sent += n;
    }
    if (chunked) {
      if (auto ec = WriteAll(kLastChunk)) return Fail("write body", ec);
    } else if (sent != request.stream_length) {
      Close();
      return InvalidArgumentError("body source produced " + std::to_string(sent) +
                                  " bytes, announced " + std::to_string(request.stream_length));
    }
    return Status::Ok();
  }

  // Reads until `buffer` holds a complete header block; returns its length.
  StatusOr<std::size_t> ReadHeaderBlock() {
    for (;;) {
      std::string_view data = BufferView(buffer);
      std::size_t skip = 0;
      while (data.substr(skip).starts_with("\r\n")) skip += 2;
      if (const auto end = data.find("\r\n\r\n", skip); end != std::string_view::npos)
        return end + 4;
      if (buffer.size() > kMaxResponseHeader) {
        Close();
        return InvalidArgumentError("response header block over 1 MiB");
      }
      std::size_t got = 0;
      const auto ec = Run([&](auto handler) {
        socket.async_read_some(
            buffer.prepare(64 * 1024),
            [&got, h = std::move(handler)](beast::error_code e, std::size_t n) mutable {
              got = n;
              h(e);
            });
      });
      buffer.commit(got);
      if (ec) return Fail("read response", ec);
    }
  }

  StatusOr<HttpResponse> Send(const HttpRequest& request) {
    if (!socket.is_open()) {
      if (Status s = Connect(); !s.ok()) return s;
    }
    if (Status s = WriteRequest(request); !s.ok()) return s;
    for (;;) {
      auto block = ReadHeaderBlock();
      if (!block.ok()) return block.status();
      std::vector<HeaderField> wire_headers =
          ParseHeaderBlock(BufferView(buffer).substr(0, *block));
      http::response_parser<http::string_body> parser;
      parser.header_limit(kMaxResponseHeader);
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      if (request.method == "HEAD") parser.skip(true);
      const auto ec =
          Run([&](auto handler) { http::async_read(socket, buffer, parser, std::move(handler)); });
      if (ec) return Fail("read response", ec);
      auto res = parser.release();
      const unsigned code = res.result_int();
      if (code >= 100 && code < 200 && code != 101) continue;  // interim response
      HttpResponse out = ToResponse(res, std::move(wire_headers));
      if (!out.keep_alive) Close();
      return out;
    }
  }
};

HttpClient::HttpClient(HostPort endpoint, Millis timeout) : impl_(std::make_unique<Impl>()) {
  impl_->endpoint = std::move(endpoint);
  impl_->timeout = timeout;
}
HttpClient::~HttpClient() = default;
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;

StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& request) { return impl_->Send(request); }
bool HttpClient::connected() const { return impl_->socket.is_open(); }
int HttpClient::connections_opened() const { return impl_->opened; }
void HttpClient::Close() { impl_->Close(); }

StatusOr<HttpResponse> SendRequest(const HostPort& endpoint, const HttpRequest& request,
                                   Millis timeout) {
  HttpClient client(endpoint, timeout);
  auto res = client.Send(request);
  client.Close();
  return res;
}

StatusOr<HttpResponse> ParseResponse(std::string_view raw) {
  http::response_parser<http::string_body> parser;
  parser.eager(true);
  parser.header_limit(kMaxResponseHeader);
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  beast::error_code ec;
  std::size_t offset = 0;
  while (!parser.is_done() && offset < raw.size()) {
    const std::size_t used = parser.put(asio::buffer(raw.data() + offset, raw.size() - offset), ec);
    offset += used;
    if (ec == http::error::need_more) {
      ec = {};
      break;
    }
    if (ec) return InvalidArgumentError("unparsable response: " + ec.message());
    if (used == 0) break;
  }
  if (!parser.is_done()) {
    parser.put_eof(ec);
    if (ec || !parser.is_done()) {
      return InvalidArgumentError("incomplete response (" + std::to_string(raw.size()) + " bytes)");
    }
  }
  return ToResponse(parser.get(), ParseHeaderBlock(raw));
}

StatusOr<RawConnection> RawConnection::Connect(const HostPort& endpoint, Millis timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  const std::string port = std::to_string(endpoint.port);
  if (int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &list); rc != 0) {
    return UnavailableError("resolve " + endpoint.host + ": " + ::gai_strerror(rc));
  }
  std::string last_error = "no address";
  const auto deadline = SteadyClock::now() + timeout;
  for (addrinfo* ai = list; ai; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, MillisLeft(deadline));
      int err = 0;
      socklen_t len = sizeof err;
      if (rc == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        rc = 0;
      } else {
        errno = rc == 0 ? ETIMEDOUT : err;
        rc = -1;
      }
    }
    if (rc == 0) {
      ::freeaddrinfo(list);
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return RawConnection(fd);
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(list);
  return UnavailableError("connect " + endpoint.ToString() + ": " + last_error);
}

RawConnection::RawConnection(RawConnection&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), closed_(other.closed_) {}

RawConnection& RawConnection::operator=(RawConnection&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    closed_ = other.closed_;
  }
  return *this;
}

RawConnection::~RawConnection() { Close(); }

void RawConnection::ShutdownWrite() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

void RawConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RawConnection::Reset() {
  if (fd_ < 0) return;
  const linger abort{.l_onoff = 1, .l_linger = 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof(abort));
  Close();
}

Status RawConnection::Write(std::string_view bytes) {
  if (fd_ < 0) return FailedPreconditionError("connection is closed");
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 10000) <= 0) return DeadlineExceededError("write blocked for 10s");
      continue;
    }
    return UnavailableError(ErrnoText("send"));
  }
  return Status::Ok();
}

StatusOr<std::string> RawConnection::ReadSome(Millis timeout) {
  if (fd_ < 0) return FailedPreconditionError("connection is closed");
  const auto deadline = SteadyClock::now() + timeout;
  for (;;) {
    char buf[16 * 1024];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      closed_ = true;  // EOF, or reset by the peer
      return std::string();
    }
    if (errno == EINTR) continue;
    const int left = MillisLeft(deadline);
    if (left == 0)
      return DeadlineExceededError("no data within " + std::to_string(timeout.count()) + "ms");
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, left);
  }
}

std::string RawConnection::ReadUntilClosed(Millis timeout) {
  const auto deadline = SteadyClock::now() + timeout;
  std::string all;
  while (!closed_) {
    auto piece = ReadSome(Millis(MillisLeft(deadline)));
    if (!piece.ok()) break;
    all += *piece;
  }
  return all;
}

// ---------------------------------------------------------------------------
// Hashing and the fake upstream

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(std::string_view data) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size());
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

std::string Base64UrlEncode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  for (unsigned char c : bytes) {
    bits = (bits << 8) | c;
    count += 8;
    while (count >= 6) {
      count -= 6;
      out.push_back(kAlphabet[(bits >> count) & 63]);
    }
  }
  if (count > 0) out.push_back(kAlphabet[(bits << (6 - count)) & 63]);
  return out;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 sha;
  sha.Update(data);
  return sha.HexDigest();
}

StatusOr<FakeStats> ParseFakeStats(std::string_view body) {
  boost::system::error_code ec;
  const auto value = boost::json::parse(body, ec);
  if (ec || !value.is_object()) return InternalError("/__stats: bad JSON: " + std::string(body));
  const auto& o = value.as_object();
  FakeStats stats;
  try {
    stats.executions = boost::json::value_to<std::uint64_t>(o.at("executions"));
    stats.connections = boost::json::value_to<std::uint64_t>(o.at("connections"));
    if (const auto* failures = o.if_contains("tls_handshake_failures")) {
      stats.tls_handshake_failures = boost::json::value_to<std::uint64_t>(*failures);
    }
    for (const auto& [k, v] : o.at("by_key").as_object()) {
      stats.by_key[std::string(k)] = boost::json::value_to<std::uint64_t>(v);
    }
  } catch (const std::exception& e) {
    return InternalError(std::string("/__stats: ") + e.what() + ": " + std::string(body));
  }
  return stats;
}

StatusOr<FakeStats> FetchFakeStats(const HostPort& fake) {
  auto res = SendRequest(fake, HttpRequest{.method = "GET", .target = "/__stats"}, 10s);
  if (!res.ok()) return res.status();
  if (res->status != 200) return InternalError("/__stats answered " + std::to_string(res->status));
  return ParseFakeStats(res->body);
}

Status ResetFake(const HostPort& fake) {
  auto res = SendRequest(fake, HttpRequest{.method = "POST", .target = "/__reset"}, 10s);
  if (!res.ok()) return res.status();
  if (res->status != 200) return InternalError("/__reset answered " + std::to_string(res->status));
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// TLS test PKI

namespace {

template <auto Free>
struct OpenSslDeleter {
  template <typename T>
  void operator()(T* p) const {
    Free(p);
  }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, OpenSslDeleter<EVP_PKEY_free>>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, OpenSslDeleter<EVP_PKEY_CTX_free>>;
using X509Ptr = std::unique_ptr<X509, OpenSslDeleter<X509_free>>;
using X509NamePtr = std::unique_ptr<X509_NAME, OpenSslDeleter<X509_NAME_free>>;
using X509ExtensionPtr = std::unique_ptr<X509_EXTENSION, OpenSslDeleter<X509_EXTENSION_free>>;
using BioPtr = std::unique_ptr<BIO, OpenSslDeleter<BIO_free_all>>;

// `step` failed: an InternalError naming it and OpenSSL's reasons, with
// OpenSSL's error queue emptied.
Status OpenSslError(std::string_view step) {
  std::string message = "MakeTestPki: " + std::string(step) + " failed";
  const char* separator = ": ";
  while (const unsigned long code = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    message += separator;
    message += text;
    separator = "; ";
  }
  return InternalError(std::move(message));
}

StatusOr<PkeyPtr> NewP256Key(std::string_view what) {
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_group_name(ctx.get(), "P-256") <= 0) {
    return OpenSslError("setting up P-256 key generation for " + std::string(what));
  }
  EVP_PKEY* key = nullptr;
  if (EVP_PKEY_generate(ctx.get(), &key) <= 0) {
    return OpenSslError("generating the P-256 key of " + std::string(what));
  }
  return PkeyPtr(key);
}

// What one certificate says about its subject.
struct CertSpec {
  std::string what;         // for error messages: "the CA", "the server certificate"
  std::string common_name;  // CN
  bool ca = false;
  std::string subject_alt_name;    // "DNS:a,IP:1.2.3.4", or empty
  std::string extended_key_usage;  // "serverAuth", "clientAuth", or empty
  bool expired = false;            // valid from 60 to 30 days ago
};

// An X.509 v3 certificate for `key` as `spec` describes it, signed by
// `issuer_key` as `issuer` (both null: self-signed).
StatusOr<X509Ptr> MakeCertificate(const CertSpec& spec, EVP_PKEY* key, X509* issuer,
                                  EVP_PKEY* issuer_key) {
  const std::string& what = spec.what;
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), X509_VERSION_3) != 1) {
    return OpenSslError("creating " + what);
  }
  // A random positive 63-bit serial: certificates of different runs (same
  // issuer names) practically never share a serial.
  std::uint64_t serial = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&serial), sizeof serial) != 1) {
    return OpenSslError("drawing the serial number of " + what);
  }
  serial = (serial >> 1) | 1;
  if (ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial) != 1) {
    return OpenSslError("setting the serial number of " + what);
  }
  // From an hour ago (clock skew) for 30 days.
  constexpr long kHour = 60 * 60;
  std::time_t now = std::time(nullptr);
  const int first_day = spec.expired ? -60 : 0;
  const int last_day = spec.expired ? -30 : 30;
  if (X509_time_adj_ex(X509_getm_notBefore(cert.get()), first_day, -kHour, &now) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), last_day, -kHour, &now) == nullptr) {
    return OpenSslError("setting the validity of " + what);
  }
  X509NamePtr name(X509_NAME_new());
  const auto add_entry = [&name](const char* field, const std::string& value) {
    return X509_NAME_add_entry_by_txt(name.get(), field, MBSTRING_UTF8,
                                      reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1,
                                      0) == 1;
  };
  if (!name || !add_entry("O", "idemgate tests") || !add_entry("CN", spec.common_name) ||
      X509_set_subject_name(cert.get(), name.get()) != 1) {
    return OpenSslError("setting the subject name of " + what);
  }
  X509* const signer = issuer ? issuer : cert.get();
  EVP_PKEY* const signer_key = issuer_key ? issuer_key : key;
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1) {
    return OpenSslError("setting the issuer name of " + what);
  }
  if (X509_set_pubkey(cert.get(), key) != 1) return OpenSslError("setting the key of " + what);

  // The subject key identifier comes first: a self-signed certificate's
  // authority key identifier is taken from it.
  std::vector<std::pair<int, std::string>> extensions;
  extensions.emplace_back(NID_subject_key_identifier, "hash");
  extensions.emplace_back(NID_authority_key_identifier, "keyid:always");
  if (spec.ca) {
    extensions.emplace_back(NID_basic_constraints, "critical,CA:TRUE");
    extensions.emplace_back(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    extensions.emplace_back(NID_basic_constraints, "critical,CA:FALSE");
    extensions.emplace_back(NID_key_usage, "critical,digitalSignature");
  }
  if (!spec.extended_key_usage.empty()) {
    extensions.emplace_back(NID_ext_key_usage, spec.extended_key_usage);
  }
  if (!spec.subject_alt_name.empty()) {
    extensions.emplace_back(NID_subject_alt_name, spec.subject_alt_name);
  }
  for (const auto& [nid, value] : extensions) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
    X509ExtensionPtr ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
    if (!ext || X509_add_ext(cert.get(), ext.get(), -1) != 1) {
      return OpenSslError("adding " + std::string(OBJ_nid2sn(nid)) + "=" + value + " to " + what);
    }
  }
  if (X509_sign(cert.get(), signer_key, EVP_sha256()) <= 0) {
    return OpenSslError("signing " + what);
  }
  return cert;
}

// Writes `cert`, or `key` when given (created with mode 0600), to `path` as PEM.
Status WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  BioPtr bio;
  if (key) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return UnavailableError("MakeTestPki: creating " + path + ": " + std::strerror(errno));
    }
    ::fchmod(fd, 0600);  // the file may have existed with a wider mode
    bio.reset(BIO_new_fd(fd, BIO_CLOSE));
    if (!bio) ::close(fd);
  } else {
    bio.reset(BIO_new_file(path.c_str(), "w"));
  }
  if (!bio) return OpenSslError("opening " + path);
  const bool written =
      key ? PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1
          : PEM_write_bio_X509(bio.get(), cert) == 1;
  if (!written || BIO_flush(bio.get()) != 1) return OpenSslError("writing " + path);
  return Status::Ok();
}

}  // namespace

StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  std::error_code fs_error;
  std::filesystem::create_directories(dir, fs_error);
  if (fs_error) {
    return UnavailableError("MakeTestPki: creating " + dir + ": " + fs_error.message());
  }
  ERR_clear_error();
  TestPki pki;
  pki.dir = dir;
  pki.ca_file = dir + "/ca.pem";
  pki.server_cert = dir + "/server.pem";
  pki.server_key = dir + "/server.key";
  pki.other_cert = dir + "/other.pem";
  pki.other_key = dir + "/other.key";
  pki.client_cert = dir + "/client.pem";
  pki.client_key = dir + "/client.key";
  pki.other_ca_file = dir + "/other-ca.pem";
  pki.expired_cert = dir + "/expired.pem";
  pki.expired_key = dir + "/expired.key";

  struct Issued {
    CertSpec spec;
    const std::string* cert_file;
    const std::string* key_file = nullptr;  // null: the key is not written
    bool self_signed = false;
  };
  const Issued plan[] = {
      {.spec = {.what = "the CA", .common_name = "idemgate test CA", .ca = true},
       .cert_file = &pki.ca_file,
       .self_signed = true},
      {.spec = {.what = "the server certificate",
                .common_name = "localhost",
                .subject_alt_name = "DNS:localhost,IP:127.0.0.1",
                .extended_key_usage = "serverAuth"},
       .cert_file = &pki.server_cert,
       .key_file = &pki.server_key},
      {.spec = {.what = "the other server certificate",
                .common_name = "other.test",
                .subject_alt_name = "DNS:other.test",
                .extended_key_usage = "serverAuth"},
       .cert_file = &pki.other_cert,
       .key_file = &pki.other_key},
      {.spec = {.what = "the client certificate",
                .common_name = "idemgate test client",
                .extended_key_usage = "clientAuth"},
       .cert_file = &pki.client_cert,
       .key_file = &pki.client_key},
      {.spec = {.what = "the other CA", .common_name = "idemgate other test CA", .ca = true},
       .cert_file = &pki.other_ca_file,
       .self_signed = true},
      {.spec = {.what = "the expired server certificate",
                .common_name = "localhost",
                .subject_alt_name = "DNS:localhost,IP:127.0.0.1",
                .extended_key_usage = "serverAuth",
                .expired = true},
       .cert_file = &pki.expired_cert,
       .key_file = &pki.expired_key},
  };

  // The first entry is the CA that signs the leaf certificates.
  X509Ptr ca;
  PkeyPtr ca_key;
  for (const Issued& item : plan) {
    auto key = NewP256Key(item.spec.what);
    if (!key.ok()) return key.status();
    auto cert = item.self_signed ? MakeCertificate(item.spec, key->get(), nullptr, nullptr)
                                 : MakeCertificate(item.spec, key->get(), ca.get(), ca_key.get());
    if (!cert.ok()) return cert.status();
    if (Status s = WritePem(*item.cert_file, cert->get(), nullptr); !s.ok()) return s;
    if (item.key_file) {
      if (Status s = WritePem(*item.key_file, nullptr, key->get()); !s.ok()) return s;
    }
    if (!ca) {
      ca = std::move(*cert);
      ca_key = std::move(*key);
    }
  }
  return pki;
}

// ---------------------------------------------------------------------------
// TlsClient

namespace ssl = asio::ssl;

struct TlsClient::Impl {
  Impl(HostPort endpoint, const TlsClientOptions& options, Millis timeout)
      : endpoint_(std::move(endpoint)), options_(options), timeout_(timeout) {
    ctx_.set_verify_mode(options.ca_file.empty() ? ssl::verify_none : ssl::verify_peer);
    if (!options.ca_file.empty()) ctx_.load_verify_file(options.ca_file);
    if (!options.cert_file.empty()) {
      ctx_.use_certificate_chain_file(options.cert_file);
      ctx_.use_private_key_file(options.key_file, ssl::context::pem);
    }
    SSL_CTX_set_min_proto_version(ctx_.native_handle(), TLS1_2_VERSION);
    if (!options.alpn.empty()) {
      std::string wire;
      for (const std::string& p : options.alpn) {
        wire += static_cast<char>(p.size());
        wire += p;
      }
      SSL_CTX_set_alpn_protos(ctx_.native_handle(), reinterpret_cast<const unsigned char*>(wire.data()),
                              static_cast<unsigned int>(wire.size()));
    }
    if (options.max_version)
      SSL_CTX_set_max_proto_version(ctx_.native_handle(), options.max_version);
  }

  // TCP connect and TLS handshake.
  Status Connect() {
    Close();
    stream_.emplace(ioc_, ctx_);
    buffer_.clear();
    if (!SetTlsPeerName(stream_->native_handle(), options_.verify_name)) {
      return InvalidArgumentError("cannot verify the name \"" + options_.verify_name + "\"");
    }
    if (session_ != nullptr) SSL_set_session(stream_->native_handle(), session_);
    boost::system::error_code ec;
    const tcp::endpoint to(asio::ip::make_address(endpoint_.host), endpoint_.port);
    ec = Run([&](auto handler) { stream_->next_layer().async_connect(to, std::move(handler)); });
    if (ec) return Fail("connect", ec);
    ec = Run([&](auto handler) {
      stream_->async_handshake(ssl::stream_base::client, std::move(handler));
    });
    if (ec) return Fail("handshake", ec);
    ++connections_;
    return Status::Ok();
  }

  // Connects first when not connected.
  StatusOr<HttpResponse> Send(const std::string& method, const std::string& target,
                              const std::string& body = "",
                              const std::vector<HeaderField>& headers = {}) {
    if (!stream_) {
      if (Status s = Connect(); !s.ok()) return s;
    }
    http::request<http::string_body> req(http::string_to_verb(method), target, 11);
    req.set(http::field::host, endpoint_.ToString());
    for (const auto& h : headers) req.insert(h.name, h.value);
    req.body() = body;
    req.prepare_payload();
    auto ec = Run([&](auto handler) { http::async_write(*stream_, req, std::move(handler)); });
    if (ec) return Fail("write", ec);
    http::response<http::string_body> res;
    ec = Run([&](auto handler) { http::async_read(*stream_, buffer_, res, std::move(handler)); });
    if (ec) return Fail("read", ec);
    HttpResponse out;
    out.status = static_cast<int>(res.result_int());
    out.reason = std::string(res.reason());
    for (const auto& field : res) {
      out.headers.push_back({std::string(field.name_string()), std::string(field.value())});
    }
    out.body = res.body();
    out.keep_alive = res.keep_alive();
    return out;
  }

  // Reads once more: what follows a response that closed the connection.
  boost::system::error_code ReadAfterClose() {
    char byte;
    return Run([&](auto handler) {
      stream_->async_read_some(asio::buffer(&byte, 1), std::move(handler));
    });
  }

  // Then reads the TCP connection under TLS: how the server ends it.
  boost::system::error_code ReadTcpAfterClose() {
    char byte;
    return Run([&](auto handler) {
      stream_->next_layer().async_read_some(asio::buffer(&byte, 1), std::move(handler));
    });
  }

  StatusOr<FakeStats> Stats() {
    auto res = Send("GET", "/__stats");
    if (!res.ok()) return res.status();
    if (res->status != 200) return InternalError("/__stats answered " + res->reason);
    return ParseFakeStats(res->body);
  }

  void Close() {
    if (!stream_) return;
    if (options_.resume_sessions) {
      // Kept for the next Connect; TLS 1.3 tickets arrive after the
      // handshake, so this is taken when the connection ends.
      if (SSL_SESSION* session = SSL_get1_session(stream_->native_handle())) {
        if (session_ != nullptr) SSL_SESSION_free(session_);
        session_ = session;
      }
      // Ended as if by close_notify: OpenSSL marks the session of a
      // connection dropped without one as not resumable.
      SSL_set_shutdown(stream_->native_handle(), SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
    }
    boost::system::error_code ignored;
    stream_->next_layer().close(ignored);
    stream_.reset();
  }

  ~Impl() {
    if (session_ != nullptr) SSL_SESSION_free(session_);
  }

  int connections() const { return connections_; }

  template <typename Start>
  boost::system::error_code Run(Start&& start) {
    std::optional<boost::system::error_code> result;
    start([&result](boost::system::error_code ec, auto&&...) { result = ec; });
    ioc_.restart();
    ioc_.run_for(timeout_);
    if (!result) {
      boost::system::error_code ignored;
      stream_->next_layer().close(ignored);
      ioc_.restart();
      ioc_.run();
      return asio::error::timed_out;
    }
    return *result;
  }

  Status Fail(std::string_view what, boost::system::error_code ec) {
    Close();
    return UnavailableError("TLS " + std::string(what) + " " + endpoint_.ToString() + ": " +
                            ec.message());
  }

  HostPort endpoint_;
  TlsClientOptions options_;
  Millis timeout_;
  asio::io_context ioc_;
  ssl::context ctx_{ssl::context::tls_client};
  std::optional<ssl::stream<tcp::socket>> stream_;
  beast::flat_buffer buffer_;
  int connections_ = 0;
  SSL_SESSION* session_ = nullptr;  // the last connection's, with resume_sessions
};


TlsClient::TlsClient(HostPort endpoint, const TlsClientOptions& options, Millis timeout)
    : impl_(std::make_unique<Impl>(std::move(endpoint), options, timeout)) {}
TlsClient::~TlsClient() = default;
Status TlsClient::Connect() { return impl_->Connect(); }
StatusOr<HttpResponse> TlsClient::Send(const std::string& method, const std::string& target, const std::string& body,
                                       const std::vector<HeaderField>& headers) {
  return impl_->Send(method, target, body, headers);
}
boost::system::error_code TlsClient::ReadAfterClose() { return impl_->ReadAfterClose(); }
boost::system::error_code TlsClient::ReadTcpAfterClose() { return impl_->ReadTcpAfterClose(); }
StatusOr<FakeStats> TlsClient::Stats() { return impl_->Stats(); }
void TlsClient::Close() { impl_->Close(); }
int TlsClient::connections() const { return impl_->connections(); }
bool TlsClient::resumed() const {
  return impl_->stream_ && SSL_session_reused(impl_->stream_->native_handle()) == 1;
}
std::string TlsClient::alpn() const {
  if (!impl_->stream_) return "";
  const unsigned char* data = nullptr;
  unsigned int size = 0;
  SSL_get0_alpn_selected(impl_->stream_->native_handle(), &data, &size);
  if (data == nullptr || size == 0) return "";
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace idemgate::testing
