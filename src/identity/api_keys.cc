#include "identity/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

#include "config/line_index.h"
#include "config/yaml_util.h"
#include "identity/claims.h"

namespace idemgate::identity {

namespace {

// Thrown inside the parser only; ParseApiKeys turns it into a Status.
struct KeysFileError {
  std::string message;
};

bool IsHex64(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

// The fields of a mapping by name, after checking that every key is a plain
// string among `allowed` and written once; a field's line is its key's.
struct Fields {
  struct Field {
    std::string name;
    YAML::Node value;
    int line = 0;
  };
  std::vector<Field> fields;

  const Field* Find(std::string_view name) const {
    for (const Field& f : fields) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
};

template <std::size_t N>
Fields CheckedFields(const std::string& source, const YAML::Node& map, int map_line,
                     const std::string& path, const std::array<std::string_view, N>& allowed) {
  auto child = [&path](std::string_view name) {
    return path.empty() ? std::string(name) : path + "." + std::string(name);
  };
  Fields out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;
    const int line = config::LineOf(key) > 0 ? config::LineOf(key) : map_line;
    if (!key.IsScalar()) {
      throw KeysFileError{
          config::Located(source, line, path, "keys must be plain strings, got " + config::DescribeNode(key))};
    }
    const std::string& name = key.Scalar();
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      throw KeysFileError{config::Located(source, line, child(name), config::UnknownKeyMessage(name, allowed))};
    }
    // yaml-cpp keeps both pairs of a key written twice (a lookup finds the first).
    if (const Fields::Field* seen = out.Find(name)) {
      throw KeysFileError{
          config::Located(source, line, child(name),
                  "duplicate key (first at line " + std::to_string(seen->line) + ")")};
    }
    out.fields.push_back({name, it->second, line});
  }
  return out;
}

// The file's one document (null for an empty file), as the config loader reads it.
YAML::Node ParseDocument(const std::string& text, const std::string& source) {
  StatusOr<YAML::Node> root = config::ParseYamlDocument(text, source);
  if (!root.ok()) throw KeysFileError{root.status().message()};
  return *root;
}

std::unordered_map<std::string, core::Caller> Parse(const std::string& text,
                                                    const std::string& source) {
  static constexpr std::array<std::string_view, 1> kTop = {"keys"};
  static constexpr std::array<std::string_view, 5> kEntry = {"sha256", "tenant", "project",
                                                             "subject", "name"};
  const YAML::Node root = ParseDocument(text, source);
  const int root_line = std::max(config::LineOf(root), 1);
  if (!root.IsMap()) {
    throw KeysFileError{config::Located(source, root_line, "",
                                "expected a mapping with a list `keys`, got " + config::DescribeNode(root))};
  }
  const Fields top = CheckedFields(source, root, root_line, "", kTop);
  const Fields::Field* list = top.Find("keys");
  if (list == nullptr)
    throw KeysFileError{config::Located(source, root_line, "", "expected a mapping with a list `keys`")};
  if (!list->value.IsSequence()) {
    throw KeysFileError{
        config::Located(source, list->line, "keys", "expected a list, got " + config::DescribeNode(list->value))};
  }

  std::unordered_map<std::string, core::Caller> keys;
  std::unordered_map<std::string, int> hash_lines;
  std::size_t i = 0;
  for (const YAML::Node& entry : list->value) {
    const std::string where = "keys[" + std::to_string(i++) + "]";
    const int entry_line = config::LineOf(entry) > 0 ? config::LineOf(entry) : list->line;
    if (!entry.IsMap()) {
      throw KeysFileError{
          config::Located(source, entry_line, where, "expected a mapping, got " + config::DescribeNode(entry))};
    }
    const Fields fields = CheckedFields(source, entry, entry_line, where, kEntry);
    // A field's value: a string (a number or true reads as written), else the error names it.
    auto value = [&](std::string_view name,
                     std::string_view expected) -> std::pair<std::string, int> {
      const Fields::Field* f = fields.Find(name);
      const std::string path = where + "." + std::string(name);
      if (f == nullptr)
        throw KeysFileError{
            config::Located(source, entry_line, path, "missing; expected " + std::string(expected))};
      if (!f->value.IsScalar()) {
        throw KeysFileError{
            config::Located(source, f->line, path,
                    "expected " + std::string(expected) + ", got " + config::DescribeNode(f->value))};
      }
      return {f->value.Scalar(), f->line};
    };
    auto [sha, sha_line] = value("sha256", "64 hex digits (the key's SHA-256)");
    if (!IsHex64(sha)) {
      throw KeysFileError{config::Located(source, sha_line, where + ".sha256",
                                  "expected 64 hex digits (the key's SHA-256)")};
    }
    std::transform(sha.begin(), sha.end(), sha.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    core::Caller caller;
    for (const auto& [name, out] : {std::pair<const char*, std::string*>{"tenant", &caller.tenant},
                                    {"project", &caller.project},
                                    {"subject", &caller.subject}}) {
      constexpr std::string_view kComponent = "1..256 visible ASCII characters";
      auto [text_value, line] = value(name, kComponent);
      if (!IsIdentityComponent(text_value)) {
        throw KeysFileError{
            config::Located(source, line, where + "." + name, "expected " + std::string(kComponent))};
      }
      *out = std::move(text_value);
    }
    // `name` labels the entry for people reading the file; any string, unused.
    if (const Fields::Field* label = fields.Find("name");
        label != nullptr && (label->value.IsMap() || label->value.IsSequence())) {
      throw KeysFileError{config::Located(source, label->line, where + ".name",
                                  "expected a string, got " + config::DescribeNode(label->value))};
    }
    if (const auto [seen, added] = hash_lines.try_emplace(sha, sha_line); !added) {
      throw KeysFileError{config::Located(
          source, sha_line, where + ".sha256",
          "the same key is listed twice (first at line " + std::to_string(seen->second) + ")")};
    }
    keys.emplace(std::move(sha), std::move(caller));
  }
  return keys;
}

}  // namespace

StatusOr<std::unordered_map<std::string, core::Caller>> ParseApiKeys(std::string_view text,
                                                                     const std::string& source) {
  try {
    return Parse(std::string(text), source);
  } catch (const KeysFileError& e) {
    return InvalidArgumentError(e.message);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(config::Located(source, e.mark.is_null() ? 0 : e.mark.line + 1, "", e.msg));
  }
}

}  // namespace idemgate::identity
