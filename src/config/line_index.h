#pragma once

#include <map>
#include <string>
#include <string_view>

// Where each key of a loaded config was written, so that checks made after
// parsing (validate.h) can still name a line. Internal to src/config.
namespace idemgate::config {

// Maps key paths ("routes[0].idempotency.retention", "upstreams.app",
// "" for the document) to 1-based lines. Not thread-safe; built once.
class LineIndex {
 public:
  // Records `line` for `path` unless one is already recorded; ignores line <= 0.
  void Set(std::string path, int line);

  // The line of `path`, else of its nearest recorded ancestor
  // ("a.b[2].c" -> "a.b[2]" -> "a.b" -> "a" -> ""); 0 when none is known.
  int Find(std::string_view path) const;

 private:
  std::map<std::string, int, std::less<>> lines_;
};

// "source:line: path: message", leaving out the parts that are unknown
// (empty source, line 0, empty path).
std::string Located(std::string_view source, int line, std::string_view path,
                    std::string_view message);

}  // namespace idemgate::config
