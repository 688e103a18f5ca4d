// The idemgate command line as a user meets it: check-config on the shipped
// examples and on files that name what is not there, a start that fails on a
// secret, and a reload that changes what needs a restart.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "fakes/testing.h"
#include "integration/harness.h"

namespace idemgate::testing {
namespace {

class CommandLineTest : public ::testing::Test {
 protected:
  // Runs idemgate with `args` (and `env` added); returns the exit status and
  // everything it printed.
  std::pair<ExitStatus, std::string> Run(const std::vector<std::string>& args,
                                         std::vector<std::pair<std::string, std::string>> env = {}) {
    ProcessOptions options;
    options.env = std::move(env);
    options.stdout_path = dir_.Join("cli.out");
    options.stderr_path = dir_.Join("cli.err");
    auto p = Process::Start(IDEMGATE_BIN, args, options);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return {};
    auto status = p->WaitExit(30s);
    EXPECT_TRUE(status.has_value()) << "idemgate did not exit";
    const std::string output = ReadFileOrEmpty(dir_.Join("cli.out")) + ReadFileOrEmpty(dir_.Join("cli.err"));
    return {status.value_or(ExitStatus{}), output};
  }

  TempDir dir_;
};

// How many times `what` occurs in `text`.
std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

constexpr char kRoutes[] =
    "upstreams:\n"
    "  app: { url: http://127.0.0.1:9 }\n"
    "routes:\n"
    "  - id: all\n"
    "    match: { path_prefix: / }\n"
    "    upstream: app\n";

// The docs point new users at these files and at check-config: each passes
// it on a machine that has none of the secrets they name (the variables are
// noted, files would have to exist).
TEST_F(CommandLineTest, EveryExampleConfigPassesCheckConfig) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(IDEMGATE_SOURCE_DIR) / "examples")) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (const std::string& file : files) {
    auto [status, output] = Run({"check-config", file});
    EXPECT_TRUE(status.exited && status.code == 0) << file << ": " << status.ToString() << "\n" << output;
    EXPECT_NE(output.find(file + ": ok"), std::string::npos) << output;
  }
}

// A file the config names that cannot be read is reported with the reason.
TEST_F(CommandLineTest, CheckConfigSaysWhyAFileCannotBeRead) {
  const std::string missing = dir_.Join("missing");
  auto keys = WriteConfig(
      dir_, std::string(kRoutes) + "identity: { mode: api_key, api_key: { keys_file: " + missing + " } }\n", "keys.yaml");
  ASSERT_TRUE(keys.ok());
  auto [status, output] = Run({"check-config", *keys});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("identity.api_key.keys_file: cannot read " + missing + ": No such file or directory"),
            std::string::npos)
      << output;

  auto secret = WriteConfig(dir_,
                            std::string(kRoutes) + "webhooks:\n  endpoints:\n    - { id: w1, tenant: t, project: p, "
                                                   "provider: github, secret_file: " + missing + " }\n",
                            "secret.yaml");
  ASSERT_TRUE(secret.ok());
  std::tie(status, output) = Run({"check-config", *secret});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("secret_file: cannot read " + missing + ": No such file or directory"), std::string::npos)
      << output;

  auto tls = WriteConfig(
      dir_, std::string(kRoutes) + "tls: { cert_file: " + missing + ", key_file: " + missing + " }\n", "tls.yaml");
  ASSERT_TRUE(tls.ok());
  std::tie(status, output) = Run({"check-config", *tls});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("cannot read listener certificate \"" + missing + "\": No such file or directory"),
            std::string::npos)
      << output;
}

// A config error quotes what the file holds (a key, a file name): its
// control characters and bytes that are not UTF-8 are escaped on the
// terminal, so the message stays one line and sends no escape sequence, at
// start as in check-config.
TEST_F(CommandLineTest, ConfigErrorsEscapeControlCharactersOnTheTerminal) {
  auto path = WriteConfig(dir_, std::string(kRoutes) + "\"a\\\"b\\\\c\\x01\\u00e9\\n\": 1\n", "key.yaml");
  ASSERT_TRUE(path.ok());
  const std::string key_error = *path + ":7: a\"b\\c\\x01\u00e9\\n: unknown key (";
  for (const std::vector<std::string>& args : {std::vector<std::string>{"check-config", *path},
                                               std::vector<std::string>{"--config", *path}}) {
    SCOPED_TRACE(args.front());
    auto [status, output] = Run(args);
    EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
    EXPECT_NE(output.find(key_error), std::string::npos) << output;
    EXPECT_EQ(Count(output, "\n"), 1u) << output;
    EXPECT_EQ(output.find('\x01'), std::string::npos) << output;
  }

  auto escape = WriteConfig(dir_, std::string(kRoutes) + "\"x\\e[31my\": 2\n", "escape.yaml");
  ASSERT_TRUE(escape.ok());
  auto [status, output] = Run({"check-config", *escape});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find(":7: x\\x1b[31my: unknown key"), std::string::npos) << output;
  EXPECT_EQ(output.find('\x1b'), std::string::npos) << output;

  // A file name that is not UTF-8, with a newline.
  const std::string missing = dir_.Join("no\xff\nsuch.yaml");
  std::tie(status, output) = Run({"check-config", missing});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find(dir_.Join("no\\xff\\nsuch.yaml")), std::string::npos) << output;
  EXPECT_EQ(Count(output, "\n"), 1u) << output;
}

// check-config --help is check-config's usage, not a file named --help;
// --version takes no other argument (an unknown one is a usage error).
TEST_F(CommandLineTest, CheckConfigHelpAndVersionArguments) {
  for (const std::string help : {"--help", "-h"}) {
    auto [status, output] = Run({"check-config", help});
    EXPECT_TRUE(status.exited && status.code == 0) << help << ": " << status.ToString() << "\n" << output;
    EXPECT_NE(output.find("Usage: idemgate check-config FILE"), std::string::npos) << output;
    EXPECT_EQ(output.find("cannot open"), std::string::npos) << output;
  }
  auto [status, output] = Run({"--version"});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_EQ(output, std::string("idemgate ") + IDEMGATE_VERSION_STRING + "\n");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--version", "extra"}, std::vector<std::string>{"extra", "--version"},
        std::vector<std::string>{"-V", "--config", "x.yaml"}}) {
    std::tie(status, output) = Run(args);
    EXPECT_TRUE(status.exited && status.code == 2) << args.front() << ": " << status.ToString() << "\n" << output;
    EXPECT_NE(output.find("Usage:"), std::string::npos) << output;
    EXPECT_EQ(output.find("idemgate " + std::string(IDEMGATE_VERSION_STRING) + "\n"), std::string::npos) << output;
  }
}

// An unset Redis password variable stops the start as an unset webhook
// secret does; check-config notes both alike.
TEST_F(CommandLineTest, CheckConfigNotesAnUnsetRedisPasswordVariable) {
  auto path = WriteConfig(
      dir_,
      std::string(kRoutes) + "store: { kind: redis, redis: { addresses: [127.0.0.1:9], password_env: H4_UNSET_PASS } }\n",
      "redis.yaml");
  ASSERT_TRUE(path.ok());
  auto [status, output] = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("note: the environment variable H4_UNSET_PASS is not set here"), std::string::npos) << output;

  std::tie(status, output) = Run({"check-config", *path}, {{"H4_UNSET_PASS", "pw"}});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_EQ(output.find("note:"), std::string::npos) << output;
}

// A shutdown_grace below the timeout of an upstream that a route stores keys
// through is taken, and said: by check-config, at start and on a reload.
TEST_F(CommandLineTest, AShutdownGraceBelowAnUpstreamTimeoutIsWarnedAbout) {
  auto yaml = [](const std::string& grace) {
    return "listen: 127.0.0.1:0\nstore: { kind: memory }\nshutdown_grace: " + grace + "\n" + kRoutes;
  };
  constexpr char kWarning[] = "shutdown_grace 1s is below the timeout 30s of upstream \"app\"";
  auto path = WriteConfig(dir_, yaml("1s"), "grace.yaml");
  ASSERT_TRUE(path.ok());
  auto [status, output] = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find(*path + ": warning: " + kWarning), std::string::npos) << output;
  EXPECT_NE(output.find(*path + ": ok"), std::string::npos) << output;
  ASSERT_TRUE(WriteFile(*path, yaml("30s")).ok());
  std::tie(status, output) = Run({"check-config", *path});
  EXPECT_TRUE(status.exited && status.code == 0) << status.ToString() << "\n" << output;
  EXPECT_EQ(output.find("warning:"), std::string::npos) << output;

  // The log escapes the quotes of the JSON string.
  constexpr char kLogged[] = "shutdown_grace 1s is below the timeout 30s of upstream \\\"app\\\"";
  auto g = GatewayProcess::Start(dir_, yaml("1s"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_NE(g->Stdout().find(kLogged), std::string::npos) << g->Stdout();
  auto reload = [&](const std::string& grace, std::size_t reloads) {
    ASSERT_TRUE(WriteFile(dir_.Join("idemgate.yaml"), yaml(grace)).ok());
    ASSERT_TRUE(g->process().Signal(SIGHUP).ok());
    const bool reloaded = PollUntil([&] { return Count(g->Stdout(), "config reloaded") == reloads; }, 10s, 20ms);
    EXPECT_TRUE(reloaded) << g->Stdout();
  };
  reload("30s", 1);
  EXPECT_EQ(Count(g->Stdout(), kLogged), 1u) << g->Stdout();
  reload("1s", 2);
  EXPECT_EQ(Count(g->Stdout(), kLogged), 2u) << g->Stdout();
  g->Stop();
}

// A start that fails on a webhook secret has not opened the store yet, so
// it leaves no embedded store directory behind.
TEST_F(CommandLineTest, AStartThatFailsOnASecretCreatesNoStore) {
  const std::string data = dir_.Join("data");
  auto path = WriteConfig(dir_,
                          "listen: 127.0.0.1:0\nstore: { kind: embedded, path: " + data + " }\n" + kRoutes +
                              "webhooks:\n  endpoints:\n    - { id: w1, tenant: t, project: p, provider: github, "
                              "secret_env: H4_UNSET_WEBHOOK_SECRET }\n",
                          "start.yaml");
  ASSERT_TRUE(path.ok());
  auto [status, output] = Run({"--config", *path});
  EXPECT_TRUE(status.exited && status.code == 1) << status.ToString() << "\n" << output;
  EXPECT_NE(output.find("H4_UNSET_WEBHOOK_SECRET is not set"), std::string::npos) << output;
  EXPECT_FALSE(std::filesystem::exists(data)) << data;
}

// admin.token_env is read at start only; a reload that changes it says so,
// as for the other settings that need a restart.
TEST_F(CommandLineTest, AReloadThatChangesTheAdminTokenVariableWarns) {
  auto yaml = [](const std::string& token_env) {
    return "listen: 127.0.0.1:0\nadmin: { listen: 127.0.0.1:0, token_env: " + token_env +
           " }\nstore: { kind: memory }\n" + kRoutes;
  };
  auto g = GatewayProcess::Start(dir_, yaml("H4_TOKEN_A"), {{"H4_TOKEN_A", "a-token"}, {"H4_TOKEN_B", "b-token"}});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(WriteFile(dir_.Join("idemgate.yaml"), yaml("H4_TOKEN_B")).ok());
  ASSERT_TRUE(g->process().Signal(SIGHUP).ok());
  const bool reloaded = PollUntil([&] { return g->Stdout().find("config reloaded") != std::string::npos; }, 10s, 20ms);
  EXPECT_TRUE(reloaded) << g->Stdout();
  EXPECT_NE(g->Stdout().find("admin.token_env changes need a restart"), std::string::npos) << g->Stdout();
  g->Stop();
}

// A reload that leaves stored records where retries no longer find them (a
// renamed route) is taken, and says so.
TEST_F(CommandLineTest, AReloadThatRenamesARouteWarnsAboutItsStoredKeys) {
  auto yaml = [](const std::string& id) {
    return "listen: 127.0.0.1:0\nstore: { kind: memory }\nupstreams:\n  app: { url: http://127.0.0.1:9 }\n"
           "routes:\n  - id: " + id + "\n    match: { path_prefix: / }\n    upstream: app\n";
  };
  auto g = GatewayProcess::Start(dir_, yaml("payments"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(WriteFile(dir_.Join("idemgate.yaml"), yaml("payments-v2")).ok());
  ASSERT_TRUE(g->process().Signal(SIGHUP).ok());
  const bool reloaded = PollUntil([&] { return g->Stdout().find("config reloaded") != std::string::npos; }, 10s, 20ms);
  EXPECT_TRUE(reloaded) << g->Stdout();
  EXPECT_NE(g->Stdout().find("config reload leaves stored keys behind"), std::string::npos) << g->Stdout();
  EXPECT_NE(g->Stdout().find("route \\\"payments\\\" is gone"), std::string::npos) << g->Stdout();
  // The same file again: compared with the running config (not the start-up one), nothing more is said.
  ASSERT_TRUE(WriteFile(dir_.Join("idemgate.yaml"), yaml("payments-v2")).ok());
  ASSERT_TRUE(g->process().Signal(SIGHUP).ok());
  const bool twice = PollUntil(
      [&] {
        const std::string out = g->Stdout();
        return out.find("config reloaded") != out.rfind("config reloaded");
      },
      10s, 20ms);
  EXPECT_TRUE(twice) << g->Stdout();
  const std::string out = g->Stdout();
  EXPECT_EQ(out.find("leaves stored keys behind"), out.rfind("leaves stored keys behind")) << out;
  g->Stop();
}

}  // namespace
}  // namespace idemgate::testing
