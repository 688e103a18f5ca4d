#include "identity/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>

#include "identity/claims.h"

namespace idemgate::identity {

namespace {

bool IsHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

}  // namespace

StatusOr<std::unordered_map<std::string, core::Caller>> ParseApiKeys(std::string_view text, const std::string& source) {
  std::unordered_map<std::string, core::Caller> keys;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap() || !root["keys"] || !root["keys"].IsSequence()) {
    return InvalidArgumentError(source + ": expected a mapping with a list `keys`");
  }
  std::size_t i = 0;
  for (const YAML::Node& entry : root["keys"]) {
    const std::string where = source + ": keys[" + std::to_string(i++) + "]";
    if (!entry.IsMap()) return InvalidArgumentError(where + ": expected a mapping");
    for (const auto& kv : entry) {
      const std::string name = kv.first.as<std::string>("");
      if (name != "sha256" && name != "tenant" && name != "project" && name != "subject" && name != "name") {
        return InvalidArgumentError(where + ": unknown key " + name);
      }
    }
    auto field = [&entry](const char* name) -> std::string {
      const YAML::Node n = entry[name];
      return n && n.IsScalar() ? n.as<std::string>("") : std::string();
    };
    std::string sha = field("sha256");
    if (!IsHex64(sha)) return InvalidArgumentError(where + ".sha256: expected 64 hex digits (the key's SHA-256)");
    std::transform(sha.begin(), sha.end(), sha.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    core::Caller caller{field("tenant"), field("project"), field("subject")};
    for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"tenant", &caller.tenant},
                                      {"project", &caller.project},
                                      {"subject", &caller.subject}}) {
      if (!IsIdentityComponent(*value)) {
        return InvalidArgumentError(where + "." + name + ": expected 1..256 visible ASCII characters");
      }
    }
    if (!keys.emplace(sha, std::move(caller)).second) {
      return InvalidArgumentError(where + ".sha256: the same key is listed twice");
    }
  }
  return keys;
}

}  // namespace idemgate::identity
