#include "config/line_index.h"

namespace idemgate::config {

void LineIndex::Set(std::string path, int line) {
  if (line <= 0) return;
  lines_.emplace(std::move(path), line);
}

int LineIndex::Find(std::string_view path) const {
  while (true) {
    auto it = lines_.find(path);
    if (it != lines_.end()) return it->second;
    if (path.empty()) return 0;
    std::size_t cut = path.find_last_of(".[");
    path = cut == std::string_view::npos ? std::string_view() : path.substr(0, cut);
  }
}

std::string Located(std::string_view source, int line, std::string_view path,
                    std::string_view message) {
  std::string out;
  if (!source.empty()) {
    out += source;
    if (line > 0) out += ":" + std::to_string(line);
    out += ": ";
  } else if (line > 0) {
    out += "line " + std::to_string(line) + ": ";
  }
  if (!path.empty()) {
    out += path;
    out += ": ";
  }
  out += message;
  return out;
}

}  // namespace idemgate::config
