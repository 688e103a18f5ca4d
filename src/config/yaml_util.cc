#include "config/yaml_util.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "config/line_index.h"

namespace idemgate::config {
namespace {

// Where each document of a YAML stream starts, and where its root node is.
class DocumentMarks final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  std::vector<YAML::Mark> roots;  // null until the document's first node

  void OnDocumentStart(const YAML::Mark& mark) override {
    starts.push_back(mark);
    roots.push_back(YAML::Mark::null_mark());
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnMapEnd() override {}

 private:
  void Node(const YAML::Mark& mark) {
    if (!roots.empty() && roots.back().is_null()) roots.back() = mark;
  }
};

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

int LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : mark.line + 1;
}

std::string DescribeNode(const YAML::Node& node) {
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


// Parses YAML text holding at most one document into its root node (null for
// an empty text). Errors are InvalidArgument, "<source>:<line>: YAML syntax
// error: ...".
std::string UnknownKeyMessage(std::string_view name, std::span<const std::string_view> allowed) {
  std::string_view best;
  std::size_t best_distance = 3;
  for (std::string_view candidate : allowed) {
    if (const std::size_t d = EditDistance(name, candidate); d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (!best.empty()) return "unknown key (did you mean \"" + std::string(best) + "\"?)";
  std::string list;
  for (std::string_view candidate : allowed) list += (list.empty() ? "" : ", ") + std::string(candidate);
  return "unknown key (allowed here: " + list + ")";
}

StatusOr<YAML::Node> ParseYamlDocument(const std::string& text, const std::string& source_name) {
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 loops there for ever, allocating, when
    // a document starts with a token no node can start with (a lone ",":
    // jbeder/yaml-cpp#1040, fixed in 0.8). Each call then makes an empty
    // document without consuming the token, so a document that starts where
    // the one before it did means the parser is stuck: a syntax error. Three
    // documents are enough to tell ("--- ," is an empty one, then the stuck
    // ones).
    std::istringstream stream(text);
    YAML::Parser parser(stream);
    DocumentMarks marks;
    while (marks.starts.size() < 3 && parser.HandleNextDocument(marks)) {
      const std::size_t n = marks.starts.size();
      if (n < 2 || marks.starts[n - 1].pos != marks.starts[n - 2].pos) continue;
      const YAML::Mark& stuck = marks.starts[n - 1];
      const char unexpected = static_cast<std::size_t>(stuck.pos) < text.size() ? text[stuck.pos] : '?';
      return InvalidArgumentError(Located(source_name, stuck.line + 1, "",
                                          std::string("YAML syntax error: unexpected \"") + unexpected +
                                              "\" (column " + std::to_string(stuck.column + 1) + ")"));
    }
    if (marks.starts.size() > 1) {
      const YAML::Mark& second = marks.starts[1];
      const YAML::Mark& root = marks.roots[1];
      return InvalidArgumentError(Located(source_name, root.is_null() ? std::max(second.line + 1, 1) : root.line + 1,
                                          "", "only one YAML document is allowed"));
    }
    // The first (only) document, parsed again into nodes.
    return marks.starts.empty() ? YAML::Node() : YAML::Load(text);
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 0 : e.mark.line + 1;
    std::string message = "YAML syntax error: " + e.msg;
    if (!e.mark.is_null()) message += " (column " + std::to_string(e.mark.column + 1) + ")";
    // A '{' or '}' inside a plain value of a { ... } mapping ends or opens a
    // mapping to YAML: "path: /webhooks/{webhook_id}" there needs quotes.
    const auto pos = e.mark.is_null() ? std::string::npos : static_cast<std::size_t>(e.mark.pos);
    if (pos != std::string::npos && pos > 0 && pos < text.size() && (text[pos] == '{' || text[pos] == '}') &&
        std::string_view(" \t:,[{").find(text[pos - 1]) == std::string_view::npos) {
      message += "; a value holding '{' or '}' must be quoted, e.g. path: \"/webhooks/{webhook_id}\"";
    }
    return InvalidArgumentError(Located(source_name, line, "", message));
  }
}

}  // namespace idemgate::config
