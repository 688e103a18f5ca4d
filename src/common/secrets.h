#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

// Reading what the config names rather than holds: secrets from environment
// variables and files, keys and key lists from files. Done when a config is
// applied (start, reload), never on a request.
namespace idemgate {

// Reads an environment variable; nullopt when it is unset. Tests supply
// their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

inline std::optional<std::string> DefaultEnvLookup(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// The whole file at `path`; InvalidArgument naming it and the cause ("cannot
// read PATH: No such file or directory") when it cannot be read.
inline StatusOr<std::string> ReadWholeFile(const std::string& path) {
  auto failed = [&path](int err) { return InvalidArgumentError("cannot read " + path + ": " + std::strerror(err)); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return failed(errno);
  std::string contents;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      contents.append(buffer, static_cast<std::size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int err = errno;  // EISDIR for a directory
      ::close(fd);
      return failed(err);
    }
  }
  ::close(fd);
  return contents;
}

// A secret file's contents without one trailing line break (as editors and
// `echo` leave one).
inline StatusOr<std::string> ReadSecretFile(const std::string& path) {
  StatusOr<std::string> secret = ReadWholeFile(path);
  if (!secret.ok()) return secret;
  if (!secret->empty() && secret->back() == '\n') secret->pop_back();
  if (!secret->empty() && secret->back() == '\r') secret->pop_back();
  return secret;
}

// A secret from the variable `env_name` or else the file `file`; fails when
// the variable is unset or empty, or the file unreadable or empty.
inline StatusOr<std::string> ReadSecret(const std::string& env_name, const std::string& file, const EnvLookup& env) {
  if (!env_name.empty()) {
    std::optional<std::string> value = env(env_name);
    if (!value || value->empty()) {
      return InvalidArgumentError("the environment variable " + env_name + " is not set or empty");
    }
    return std::move(*value);
  }
  StatusOr<std::string> secret = ReadSecretFile(file);
  if (!secret.ok()) return secret;
  if (secret->empty()) return InvalidArgumentError(file + " is empty");
  return secret;
}

}  // namespace idemgate
