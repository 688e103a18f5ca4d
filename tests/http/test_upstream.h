#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// A tiny HTTP/1.1 upstream for in-process proxy tests, on 127.0.0.1:0 with
// its own thread. Endpoints (any method):
//   /echo...          200, body = request body; response carries hop-by-hop
//                     fields (Connection: X-Hop, X-Hop, Keep-Alive), X-Secret: s,
//                     two Set-Cookie lines and X-Upstream: yes
//   /sink             streams the body away, counting it; 200 "bytes=N fnv=H"
//   /large?n=N        N bytes of 'a'..'z' repeated, chunked, in 16 KiB writes
//   /gated?n=N&first=M  Content-Length N; M bytes, then the rest once OpenGate()
//   /slow             answers after 20 s (never, in a test)
//   /close            200 "closing" (no Connection: close), then closes the socket
//   /die              Content-Length 1000, 10 bytes, then closes
//   /reset?at=head|body  part of a response (the head cut short, or a whole
//                     head with 10 of 1000 body bytes), then a reset at once
//   /halfclose        200 "ok" (no Connection: close), then, once OpenGate(),
//                     a FIN: the write side closed, the connection still read
//   /eof              HTTP/1.0 200 whose body ends with the connection (one
//                     write, then close)
//   /canned/NAME      a fixed response as written (test_upstream.cc has the
//                     list), e.g. two Content-Length lines
//   /early?status=S&then=close|wait  S "early" as soon as the request head is
//                     in, the body unread; then closes (a reset, with body
//                     bytes unread) or keeps the connection without reading
//   ...?continue=1    (any endpoint) an unasked 100 Continue once the head
//                     is in, then 200 ms before the body is read
//   /stray?status=S&announce=A  a complete response with status S (200 "ok",
//                     or bodiless), then, once OpenGate(), kStray on the same
//                     connection, which stays open. With A=1, and always for
//                     HEAD, the head carries a Content-Length for those bytes,
//                     as an upstream writing a body after a HEAD or 204 head
// Thread-safe accessors.
namespace idemgate::httptest {

// What /stray writes after its response: a response nobody asked for.
inline constexpr std::string_view kStray = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray";

// FNV-1a 64 over `data`, continuing from `h`.
std::uint64_t Fnv1a(std::string_view data, std::uint64_t h = 1469598103934665603ull);
// 'a' + i % 26 for i in [offset, offset + n).
std::string Pattern(std::size_t n, std::size_t offset = 0);

struct SeenRequest {
  std::string method;
  std::string target;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // Every value of `name` (case-insensitive), in order.
  std::vector<std::string> Values(std::string_view name) const;
};

class TestUpstream {
 public:
  TestUpstream();
  ~TestUpstream();
  TestUpstream(const TestUpstream&) = delete;
  TestUpstream& operator=(const TestUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  int connections() const { return connections_.load(); }
  int requests() const { return requests_.load(); }
  // Connections /close has closed after its answer.
  int closed_after_answer() const { return closed_after_answer_.load(); }
  // Connections /halfclose has half-closed.
  int half_closed() const { return half_closed_.load(); }
  // Connections the client (the gateway) closed, with a FIN or a reset,
  // while they waited for a request: idle ones it dropped.
  int closed_between_requests() const { return closed_between_requests_.load(); }
  // Times /stray has written kStray.
  int stray_written() const { return stray_written_.load(); }
  // Answers /early has written.
  int early_answers() const { return early_answers_.load(); }
  // Body bytes /sink has received so far (while the request is running).
  std::uint64_t sink_bytes() const { return sink_bytes_.load(); }
  // The last request to /echo.
  SeenRequest last_echo() const;
  void OpenGate() { gate_.store(true); }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_ = 0;
  std::atomic<int> connections_{0};
  std::atomic<int> closed_after_answer_{0};
  std::atomic<int> stray_written_{0};
  std::atomic<int> half_closed_{0};
  std::atomic<int> closed_between_requests_{0};
  std::atomic<int> early_answers_{0};
  std::atomic<int> requests_{0};
  std::atomic<std::uint64_t> sink_bytes_{0};
  std::atomic<bool> gate_{false};
  mutable std::mutex mu_;
  SeenRequest last_echo_;
  friend struct Impl;
};

}  // namespace idemgate::httptest
