// Every sample config shipped under examples/ must load: docs and quick
// starts point users at these files.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "config/warnings.h"

namespace idemgate::config {
namespace {

std::vector<std::string> ExampleConfigs() {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(IDEMGATE_SOURCE_DIR) / "examples";
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.size() > 5 && name.ends_with(".yaml")) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(ExamplesTest, EveryExampleYamlLoads) {
  const std::vector<std::string> files = ExampleConfigs();
  // examples/configs/reference.yaml ships with this test.
  ASSERT_FALSE(files.empty()) << "no *.yaml under " << IDEMGATE_SOURCE_DIR << "/examples";
  for (const std::string& file : files) {
    StatusOr<Config> c = LoadFile(file);
    EXPECT_TRUE(c.ok()) << c.status().message();
    if (c.ok()) {
      EXPECT_FALSE(c->routes.empty()) << file;
    }
  }
}

std::string ReadSource(const std::string& relative) {
  std::ifstream in(std::string(IDEMGATE_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// docs/configuration.md shows the errors of four edited copies of
// examples/quickstart.yaml: they must be the loader's real messages for the
// file as it ships (its line numbers, its upstream's name).
TEST(ExamplesTest, ConfigurationDocsShowTheQuickstartsRealErrors) {
  const std::string docs = ReadSource("docs/configuration.md");
  const std::string quickstart = ReadSource("examples/quickstart.yaml");
  ASSERT_FALSE(docs.empty());
  ASSERT_FALSE(quickstart.empty());
  const std::vector<std::pair<std::string, std::string>> edits = {
      {"scope: global, retention: 24h }", "scope: global, retention: 1x }"},
      {"timeout: 5s, connect_timeout", "timout: 5s, connect_timeout"},
      {"- id: everything-else", "- id: payments"},
      {"\n    in_flight: reject", "\n   in_flight: reject"},
  };
  for (const auto& [from, to] : edits) {
    std::string edited = quickstart;
    const std::size_t at = edited.find(from);
    ASSERT_NE(at, std::string::npos) << "examples/quickstart.yaml no longer holds " << from;
    edited.replace(at, from.size(), to);
    StatusOr<Config> c = LoadString(edited, "quickstart.yaml");
    ASSERT_FALSE(c.ok()) << to;
    EXPECT_NE(docs.find("  " + c.status().message() + "\n"), std::string::npos)
        << "docs/configuration.md does not show: " << c.status().message();
  }
}

// A shipped example teaches its settings: none may leave a SIGTERM able to
// release the key of a write its upstream may still run.
TEST(ExamplesTest, NoExampleHasAShutdownGraceBelowAnUpstreamTimeout) {
  for (const std::string& file : ExampleConfigs()) {
    StatusOr<Config> c = LoadFile(file);
    ASSERT_TRUE(c.ok()) << c.status().message();
    for (const std::string& warning : ShutdownGraceWarnings(*c)) ADD_FAILURE() << file << ": " << warning;
  }
}

TEST(ExamplesTest, ReferenceConfigKeepsDocumentedDefaults) {
  StatusOr<Config> c =
      LoadFile(std::string(IDEMGATE_SOURCE_DIR) + "/examples/configs/reference.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  Config defaults;
  // The reference file spells out each default; loading it must change nothing
  // that the file does not mark as different.
  EXPECT_EQ(c->listen, defaults.listen);
  EXPECT_EQ(c->shutdown_grace, defaults.shutdown_grace);
  EXPECT_EQ(c->limits.max_header_bytes, defaults.limits.max_header_bytes);
  EXPECT_EQ(c->limits.max_request_bytes, defaults.limits.max_request_bytes);
  EXPECT_EQ(c->limits.max_connections, defaults.limits.max_connections);
  EXPECT_EQ(c->store.path, defaults.store.path);
  EXPECT_EQ(c->store.max_bytes, defaults.store.max_bytes);
  EXPECT_EQ(c->store.redis.timeout, defaults.store.redis.timeout);
  // A copy of the file must not trust identity headers that any client can send.
  EXPECT_EQ(c->identity.mode, defaults.identity.mode);
  EXPECT_EQ(c->identity.trusted_headers.tenant, defaults.identity.trusted_headers.tenant);
  EXPECT_EQ(c->workers, defaults.workers);
  EXPECT_EQ(c->merge_slashes, defaults.merge_slashes);
  EXPECT_EQ(c->store.kind, defaults.store.kind);
  EXPECT_EQ(c->store.sync, defaults.store.sync);
  EXPECT_EQ(c->store.on_error, defaults.store.on_error);
  EXPECT_EQ(c->store.redis.key_prefix, defaults.store.redis.key_prefix);
  EXPECT_EQ(c->metrics.tenant_labels, defaults.metrics.tenant_labels);
  EXPECT_EQ(c->log.level, defaults.log.level);
  EXPECT_EQ(c->log.format, defaults.log.format);
  const Idempotency& d = c->defaults;
  const Idempotency& want = defaults.defaults;
  EXPECT_EQ(d.policy, want.policy);
  EXPECT_EQ(d.header, want.header);
  EXPECT_EQ(d.methods, want.methods);
  EXPECT_EQ(d.retention, want.retention);
  EXPECT_EQ(d.wait_timeout, want.wait_timeout);
  EXPECT_EQ(d.max_response_bytes, want.max_response_bytes);
  EXPECT_EQ(d.terminal_header, want.terminal_header);
  EXPECT_EQ(d.replay_header, want.replay_header);
  EXPECT_EQ(d.fingerprint.headers, want.fingerprint.headers);
  EXPECT_EQ(d.key.max_length, want.key.max_length);
}

}  // namespace
}  // namespace idemgate::config
