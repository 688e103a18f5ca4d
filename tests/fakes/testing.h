#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/system/error_code.hpp>

#include "common/status.h"

// Helpers for tests that run real binaries: child processes, ready files,
// a small synchronous HTTP/1.1 client, raw sockets, temp files.
// Nothing here includes Asio or Beast, so tests that use it build fast.
// Unless noted, objects are not thread-safe; free functions are.
namespace idemgate::testing {

using namespace std::chrono_literals;
using Millis = std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// Files

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on
// destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name.
  std::string Join(std::string_view name) const;

 private:
  std::string path_;
};

Status WriteFile(const std::string& path, std::string_view contents);
StatusOr<std::string> ReadFile(const std::string& path);
// The file's contents, or "" if it cannot be read (for failure messages).
std::string ReadFileOrEmpty(const std::string& path);
// Writes `yaml` to dir/name and returns the path.
StatusOr<std::string> WriteConfig(const TempDir& dir, std::string_view yaml,
                                  std::string_view name = "idemgate.yaml");

// Calls `done` every `interval` until it returns true or `timeout` passes.
// Returns the last result of `done`.
bool PollUntil(const std::function<bool()>& done, Millis timeout, Millis interval = 10ms);

// ---------------------------------------------------------------------------
// ASCII case-insensitive equality (header names).
bool IEquals(std::string_view a, std::string_view b);

// Processes

struct ExitStatus {
  bool exited = false;  // exited normally: `code` is valid; else killed by `signal`
  int code = -1;
  int signal = 0;
  std::string ToString() const;  // "exit 0", "signal 9"
};

struct ProcessOptions {
  // Added to (or replacing entries of) the inherited environment.
  std::vector<std::pair<std::string, std::string>> env;
  // Where the child's stdout / stderr go; empty: inherited from the test.
  std::string stdout_path;
  std::string stderr_path;
};

// A child process owned by a test. Move-only. The destructor SIGKILLs and reaps
// a child that is still running, and the child also receives SIGKILL if the
// thread that started it dies (PR_SET_PDEATHSIG), so a crashed test leaves no
// process behind.
class Process {
 public:
  // Starts `exe` with `args` (argv[0] is `exe`). Fails if fork or exec fails.
  static StatusOr<Process> Start(const std::string& exe, const std::vector<std::string>& args,
                                 const ProcessOptions& options = {});

  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process();

  pid_t pid() const { return pid_; }
  // True while the child has not exited (reaps it if it has).
  bool Running();
  // Sends `sig` to a running child.
  Status Signal(int sig);
  // Waits up to `timeout` for the child to exit; nullopt if it is still
  // running. Once the child exited, returns its status immediately.
  std::optional<ExitStatus> WaitExit(Millis timeout);
  // SIGKILL and reap; no-op when the child has exited.
  void Kill();
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

 private:
  explicit Process(pid_t pid) : pid_(pid) {}
  bool Reap(bool block);

  pid_t pid_ = -1;
  std::optional<ExitStatus> exit_status_;
};

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  std::string ToString() const;  // "host:port"
};
// Parses "host:port" (IPv4 or name; "[v6]:port" too).
StatusOr<HostPort> ParseHostPort(std::string_view text);

// The key=value lines of a ready file ("listen=127.0.0.1:8080").
using ReadyInfo = std::map<std::string, std::string>;

// Waits up to `timeout` for `path` to exist and end with a newline, then
// parses it. Fails early if `process` (when given) exits first.
StatusOr<ReadyInfo> WaitForReadyFile(const std::string& path, Millis timeout,
                                     Process* process = nullptr);

// A server started with `--ready-file`, running and listening.
struct Server {
  Process process;
  ReadyInfo ready;
  // The address under `key` in the ready file.
  StatusOr<HostPort> Endpoint(const std::string& key = "listen") const;
};

// Starts `exe args... --ready-file ready_file` and waits up to `timeout` for
// the ready file. On failure the process is killed and the message carries
// the exit status.
StatusOr<Server> StartServer(const std::string& exe, std::vector<std::string> args,
                             const std::string& ready_file, const ProcessOptions& options = {},
                             Millis timeout = 20s);

// A port on 127.0.0.1 that was free a moment ago (bound to 0, then closed),
// for a server about to be started on it. For a port that must refuse
// connections, use RefusedPort: a closed port may be handed out again at
// once, even to the next listener bound to port 0.
StatusOr<std::uint16_t> PickFreePort();

// A port on 127.0.0.1 that refuses connections for as long as this object
// lives: a socket is bound to it but does not listen, so connects get
// ECONNREFUSED and the port cannot be handed to another socket meanwhile.
class RefusedPort {
 public:
  static StatusOr<RefusedPort> Make();
  RefusedPort(RefusedPort&& other) noexcept : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}
  RefusedPort& operator=(RefusedPort&&) = delete;
  RefusedPort(const RefusedPort&) = delete;
  ~RefusedPort();
  std::uint16_t port() const { return port_; }
  // Frees the port now, for a server about to be started on it (as
  // PickFreePort).
  void Close();

 private:
  RefusedPort(int fd, std::uint16_t port) : fd_(fd), port_(port) {}
  int fd_;
  std::uint16_t port_;
};

// Reads a "Name:   123 kB" line of /proc/PID/status; returns the number (kB).
StatusOr<std::uint64_t> ProcStatusKiB(pid_t pid, std::string_view field);

// ---------------------------------------------------------------------------
// HTTP

struct HeaderField {
  std::string name;
  std::string value;
};

// The field lines of a raw HTTP header block (start line first, CRLF line
// ends, stops at the empty line), in wire order, values without surrounding
// white space. Lines without a colon are skipped.
std::vector<HeaderField> ParseHeaderBlock(std::string_view block);

// Produces a request body piece by piece: writes up to `capacity` bytes into
// `out` and returns how many; returns 0 only at the end.
using BodySource = std::function<std::size_t(char* out, std::size_t capacity)>;

struct HttpRequest {
  std::string method = "GET";
  std::string target = "/";
  // Sent byte for byte as given, in order. Host is added first when absent;
  // Content-Length is added last when neither it nor Transfer-Encoding is
  // given and there is a body (or the method is POST/PUT/PATCH). With a
  // Transfer-Encoding naming chunked, the body is sent in chunked coding.
  std::vector<HeaderField> headers;
  std::string body;
  // When set, the body is streamed from here instead; `stream_length` bytes
  // are announced in Content-Length and must be produced.
  BodySource stream;
  std::uint64_t stream_length = 0;
};

struct HttpResponse {
  int status = 0;
  std::string reason;
  std::vector<HeaderField> headers;  // in wire order, as received (same-name lines not grouped)
  std::string body;
  bool keep_alive = false;  // the response allows the connection to be reused

  // First value of `name` (case-insensitive), if any.
  std::optional<std::string> Header(std::string_view name) const;
  // Every value of `name`, in order.
  std::vector<std::string> Headers(std::string_view name) const;
  bool HasHeader(std::string_view name) const { return Header(name).has_value(); }
};

// A synchronous HTTP/1.1 client on one keep-alive connection.
class HttpClient {
 public:
  // `timeout` bounds each connect, write and read of a request.
  explicit HttpClient(HostPort endpoint, Millis timeout = 30s);
  ~HttpClient();
  HttpClient(HttpClient&&) noexcept;
  HttpClient& operator=(HttpClient&&) noexcept;

  // Sends on the open connection when there is one, else on a new one. The
  // connection is closed afterwards if the response does not allow reuse or
  // on any error (a body cut short is an error, never a short success).
  StatusOr<HttpResponse> Send(const HttpRequest& request);
  bool connected() const;
  // Connections opened so far.
  int connections_opened() const;
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One request on a fresh connection, closed afterwards.
StatusOr<HttpResponse> SendRequest(const HostPort& endpoint, const HttpRequest& request,
                                   Millis timeout = 30s);

// Parses one complete HTTP/1.1 response at the start of `raw` (bytes read
// from a RawConnection). A response without Content-Length or chunking
// takes the rest of `raw` as its body.
StatusOr<HttpResponse> ParseResponse(std::string_view raw);

// A plain TCP connection for malformed or slow requests.
class RawConnection {
 public:
  static StatusOr<RawConnection> Connect(const HostPort& endpoint, Millis timeout = 10s);
  RawConnection(RawConnection&& other) noexcept;
  RawConnection& operator=(RawConnection&& other) noexcept;
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  ~RawConnection();

  // Writes all of `bytes`; fails if the peer has closed or reset.
  Status Write(std::string_view bytes);
  // Waits up to `timeout` for data: returns what arrived (at least one byte),
  // "" when the peer closed (then closed() is true), or DeadlineExceeded.
  StatusOr<std::string> ReadSome(Millis timeout);
  // Reads until the peer closes or `timeout` passes; returns all bytes read.
  // closed() tells which.
  std::string ReadUntilClosed(Millis timeout);
  // The peer closed (EOF) or reset the connection, as seen by a read.
  bool closed() const { return closed_; }
  // Ends the sending side (a FIN); reads still work.
  void ShutdownWrite();
  void Close();
  // Closes with a reset (RST) instead of a FIN.
  void Reset();

 private:
  explicit RawConnection(int fd) : fd_(fd) {}
  int fd_ = -1;
  bool closed_ = false;
};

// ---------------------------------------------------------------------------
// Hashing and the fake upstream

// Incremental SHA-256; HexDigest() ends it.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(std::string_view data);
  std::string HexDigest();  // lower-case hex

 private:
  void* ctx_;
};
std::string Sha256Hex(std::string_view data);
// RFC 4648 §5 base64url without padding (JWT parts).
std::string Base64UrlEncode(std::string_view bytes);

// What fake_upstream's GET /__stats reports.
struct FakeStats {
  std::uint64_t executions = 0;
  std::map<std::string, std::uint64_t> by_key;  // Idempotency-Key value -> executions
  std::uint64_t connections = 0;                // TCP connections accepted
  std::uint64_t tls_handshake_failures = 0;     // with --tls-cert; 0 in plain mode
};
// Parses the body of GET /__stats (tls_handshake_failures is optional).
StatusOr<FakeStats> ParseFakeStats(std::string_view json);
// GET /__stats over plain HTTP (a fake started without --tls-cert).
StatusOr<FakeStats> FetchFakeStats(const HostPort& fake);
// Zeroes the fake's counters (POST /__reset).
Status ResetFake(const HostPort& fake);

// ---------------------------------------------------------------------------
// TLS test PKI

// PEM files of a throw-away PKI for TLS tests, written into `dir` (created
// when missing; existing files of these names are replaced):
//   ca.pem                  a self-signed CA certificate ("idemgate test CA")
//   server.pem, server.key  a server certificate signed by that CA, CN=localhost,
//                           subjectAltName DNS:localhost, IP:127.0.0.1
//   other.pem, other.key    a second server certificate signed by the same CA,
//                           CN=other.test, subjectAltName DNS:other.test only
//   client.pem, client.key  a client certificate (extendedKeyUsage clientAuth)
//                           signed by the CA, CN "idemgate test client"
//   other-ca.pem            an unrelated self-signed CA ("idemgate other test CA"):
//                           what a wrong trust anchor looks like
// Keys are EC P-256 (unencrypted PKCS#8, mode 0600); certificates are X.509 v3,
// signed with SHA-256, valid from one hour ago for 30 days, with random
// serial numbers. Every call makes new keys. Fails with a Status naming the
// step (and OpenSSL's reason) that failed.
struct TestPki {
  std::string dir;
  std::string ca_file;        // dir/ca.pem
  std::string server_cert;    // dir/server.pem
  std::string server_key;     // dir/server.key
  std::string other_cert;     // dir/other.pem
  std::string other_key;      // dir/other.key
  std::string client_cert;    // dir/client.pem
  std::string client_key;     // dir/client.key
  std::string other_ca_file;  // dir/other-ca.pem
  std::string expired_cert;   // dir/expired.pem: for localhost, expired a month ago
  std::string expired_key;    // dir/expired.key
};
StatusOr<TestPki> MakeTestPki(const std::string& dir);

struct TlsClientOptions {
  std::string ca_file;                    // the only trust anchor; empty: verify nothing
  std::string verify_name = "localhost";  // a host name (also sent as SNI), or an IP address
  std::string cert_file, key_file;        // a client certificate, when set
  int max_version = 0;                    // e.g. TLS1_2_VERSION; 0: up to TLS 1.3
  std::vector<std::string> alpn;          // protocols offered by ALPN, in order; empty: no ALPN
  bool resume_sessions = false;           // offer the last connection's session on the next Connect
};

// A synchronous HTTPS/1.1 client on one keep-alive connection; every
// connect, handshake, write and read is bounded by `timeout`.
class TlsClient {
 public:
  TlsClient(HostPort endpoint, const TlsClientOptions& options, Millis timeout = 5s);
  ~TlsClient();
  TlsClient(const TlsClient&) = delete;
  TlsClient& operator=(const TlsClient&) = delete;

  // TCP connect and TLS handshake (closing a connection already open).
  Status Connect();
  // Connects first when not connected. Host is set to the endpoint.
  StatusOr<HttpResponse> Send(const std::string& method, const std::string& target, const std::string& body = "",
                              const std::vector<HeaderField>& headers = {});
  // Reads once more through TLS: how the server ended the connection after
  // a response that closed it (eof after close_notify).
  boost::system::error_code ReadAfterClose();
  // Then reads the TCP connection under TLS.
  boost::system::error_code ReadTcpAfterClose();
  // GET /__stats of a fake_upstream, over this connection.
  StatusOr<FakeStats> Stats();
  void Close();
  // Handshakes completed so far.
  int connections() const;
  // The protocol the server chose by ALPN on the current connection, or "".
  std::string alpn() const;
  // The current connection resumed an earlier session.
  bool resumed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idemgate::testing
