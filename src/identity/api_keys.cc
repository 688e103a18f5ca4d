#include "identity/api_keys.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <sstream>
#include <vector>

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

int LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : mark.line + 1;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "\"" + node.Scalar() + "\"";
    default:
      return "nothing";
  }
}

// "source:line: path: message" as the config loader writes it (config/line_index.h),
// leaving out a line that is not known and an empty path.
std::string Located(std::string_view source, int line, std::string_view path,
                    std::string_view message) {
  std::string out(source);
  if (line > 0) out += ":" + std::to_string(line);
  out += ": ";
  if (!path.empty()) out.append(path).append(": ");
  return out.append(message);
}

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Where each document of a YAML stream starts (as the config loader counts them).
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

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
    const int line = LineOf(key) > 0 ? LineOf(key) : map_line;
    if (!key.IsScalar()) {
      throw KeysFileError{
          Located(source, line, path, "keys must be plain strings, got " + Describe(key))};
    }
    const std::string& name = key.Scalar();
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      std::string_view best;
      std::size_t best_distance = 3;
      for (std::string_view candidate : allowed) {
        if (const std::size_t d = EditDistance(name, candidate); d < best_distance) {
          best_distance = d;
          best = candidate;
        }
      }
      std::string message;
      if (!best.empty()) {
        message = "unknown key (did you mean \"" + std::string(best) + "\"?)";
      } else {
        for (std::string_view candidate : allowed)
          message += (message.empty() ? "" : ", ") + std::string(candidate);
        message = "unknown key (allowed here: " + message + ")";
      }
      throw KeysFileError{Located(source, line, child(name), message)};
    }
    // yaml-cpp keeps both pairs of a key written twice (a lookup finds the first).
    if (const Fields::Field* seen = out.Find(name)) {
      throw KeysFileError{
          Located(source, line, child(name),
                  "duplicate key (first at line " + std::to_string(seen->line) + ")")};
    }
    out.fields.push_back({name, it->second, line});
  }
  return out;
}

// Parses YAML text holding at most one document into its root node (null for
// an empty text), as the config loader does.
YAML::Node ParseDocument(const std::string& text, const std::string& source) {
  try {
    // Not YAML::LoadAll, which loops for ever in yaml-cpp 0.7 on a document
    // starting with a token no node can start with: such a document starts
    // where the one before it did.
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentStarts marks;
    while (marks.starts.size() < 3 && parser.HandleNextDocument(marks)) {
      const std::size_t n = marks.starts.size();
      if (n < 2 || marks.starts[n - 1].pos != marks.starts[n - 2].pos) continue;
      const YAML::Mark& stuck = marks.starts[n - 1];
      const char unexpected =
          static_cast<std::size_t>(stuck.pos) < text.size() ? text[stuck.pos] : '?';
      throw KeysFileError{Located(source, stuck.line + 1, "",
                                  std::string("YAML syntax error: unexpected \"") + unexpected +
                                      "\" (column " + std::to_string(stuck.column + 1) + ")")};
    }
    if (marks.starts.size() > 1) {
      throw KeysFileError{Located(source, std::max(marks.starts[1].line + 1, 1), "",
                                  "only one YAML document is allowed")};
    }
    return marks.starts.empty() ? YAML::Node() : YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string message = "YAML syntax error: " + e.msg;
    if (!e.mark.is_null()) message += " (column " + std::to_string(e.mark.column + 1) + ")";
    throw KeysFileError{Located(source, e.mark.is_null() ? 0 : e.mark.line + 1, "", message)};
  }
}

std::unordered_map<std::string, core::Caller> Parse(const std::string& text,
                                                    const std::string& source) {
  static constexpr std::array<std::string_view, 1> kTop = {"keys"};
  static constexpr std::array<std::string_view, 5> kEntry = {"sha256", "tenant", "project",
                                                             "subject", "name"};
  const YAML::Node root = ParseDocument(text, source);
  const int root_line = std::max(LineOf(root), 1);
  if (!root.IsMap()) {
    throw KeysFileError{Located(source, root_line, "",
                                "expected a mapping with a list `keys`, got " + Describe(root))};
  }
  const Fields top = CheckedFields(source, root, root_line, "", kTop);
  const Fields::Field* list = top.Find("keys");
  if (list == nullptr)
    throw KeysFileError{Located(source, root_line, "", "expected a mapping with a list `keys`")};
  if (!list->value.IsSequence()) {
    throw KeysFileError{
        Located(source, list->line, "keys", "expected a list, got " + Describe(list->value))};
  }

  std::unordered_map<std::string, core::Caller> keys;
  std::unordered_map<std::string, int> hash_lines;
  std::size_t i = 0;
  for (const YAML::Node& entry : list->value) {
    const std::string where = "keys[" + std::to_string(i++) + "]";
    const int entry_line = LineOf(entry) > 0 ? LineOf(entry) : list->line;
    if (!entry.IsMap()) {
      throw KeysFileError{
          Located(source, entry_line, where, "expected a mapping, got " + Describe(entry))};
    }
    const Fields fields = CheckedFields(source, entry, entry_line, where, kEntry);
    // A field's value: a string (a number or true reads as written), else the error names it.
    auto value = [&](std::string_view name,
                     std::string_view expected) -> std::pair<std::string, int> {
      const Fields::Field* f = fields.Find(name);
      const std::string path = where + "." + std::string(name);
      if (f == nullptr)
        throw KeysFileError{
            Located(source, entry_line, path, "missing; expected " + std::string(expected))};
      if (!f->value.IsScalar()) {
        throw KeysFileError{
            Located(source, f->line, path,
                    "expected " + std::string(expected) + ", got " + Describe(f->value))};
      }
      return {f->value.Scalar(), f->line};
    };
    auto [sha, sha_line] = value("sha256", "64 hex digits (the key's SHA-256)");
    if (!IsHex64(sha)) {
      throw KeysFileError{Located(source, sha_line, where + ".sha256",
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
            Located(source, line, where + "." + name, "expected " + std::string(kComponent))};
      }
      *out = std::move(text_value);
    }
    // `name` labels the entry for people reading the file; any string, unused.
    if (const Fields::Field* label = fields.Find("name");
        label != nullptr && (label->value.IsMap() || label->value.IsSequence())) {
      throw KeysFileError{Located(source, label->line, where + ".name",
                                  "expected a string, got " + Describe(label->value))};
    }
    if (const auto [seen, added] = hash_lines.try_emplace(sha, sha_line); !added) {
      throw KeysFileError{Located(
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
    return InvalidArgumentError(Located(source, e.mark.is_null() ? 0 : e.mark.line + 1, "", e.msg));
  }
}

}  // namespace idemgate::identity
