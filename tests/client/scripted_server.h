#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/client.h"

// An HTTP/1.1 server for client tests: listens on 127.0.0.1 (port 0) in its
// own thread, answers each request with the next canned action of its script
// and records every request it read. Thread-safe.
namespace idemgate::client::testing {

struct Canned {
  enum class Kind {
    kAnswer,       // status, headers and body, then close
    kRaw,          // `body` written as is (the whole response), then close
    kClose,        // close without answering
    kNeverAnswer,  // keep the connection open and say nothing
  };
  Kind kind = Kind::kAnswer;
  int status = 200;
  std::vector<client::Header> headers;
  std::string body;

  static Canned Answer(int status, std::vector<client::Header> headers = {}, std::string body = "");
  // application/problem+json with {"code": code}.
  static Canned Problem(int status, std::string_view code, std::vector<client::Header> headers = {});
  static Canned Raw(std::string bytes);
  static Canned Close();
  static Canned NeverAnswer();
};

struct Recorded {
  std::string method;
  std::string target;
  std::vector<client::Header> headers;  // in wire order, names as sent
  std::string body;

  // The first value of `name` (case-insensitive).
  std::optional<std::string> Get(std::string_view name) const;
  // How many lines named `name` (case-insensitive).
  int Count(std::string_view name) const;
};

class ScriptedServer {
 public:
  ScriptedServer();
  ~ScriptedServer();
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  // Appends to the script. Without a script left the server answers 599.
  void Push(Canned action);
  std::vector<Recorded> requests() const;
  std::uint16_t port() const;
  // "http://127.0.0.1:<port>" + path.
  std::string Url(std::string_view path = "/") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A local port nothing listens on (bound, then closed).
std::uint16_t ClosedPort();

}  // namespace idemgate::client::testing
