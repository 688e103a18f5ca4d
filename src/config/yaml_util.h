#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

// Reading YAML strictly, for the config loader and the YAML files a config
// names (webhooks.file, the API keys file): one document, lines for messages,
// "did you mean" suggestions (Levenshtein distance). Messages are written with Located
// (config/line_index.h): "<source>:<line>: <key path>: <what>".
namespace idemgate::config {

// The 1-based line where `node` starts; 0 when unknown.
int LineOf(const YAML::Node& node);

// "a mapping", "a list", "\"<scalar>\"" or "nothing", for "expected X, got Y".
std::string DescribeNode(const YAML::Node& node);

// "unknown key (did you mean \"<closest>\"?)" when one of `allowed` is
// within two edits of `name`, else "unknown key (allowed here: a, b, ...)".
std::string UnknownKeyMessage(std::string_view name, std::span<const std::string_view> allowed);

// Parses YAML text holding at most one document into its root node (null for
// an empty text). Errors are InvalidArgument, "<source>:<line>: YAML syntax
// error: ..." or "...: only one YAML document is allowed".
StatusOr<YAML::Node> ParseYamlDocument(const std::string& text, const std::string& source_name);

}  // namespace idemgate::config
