// End-to-end tests of idemctl (SPEC §10): the real idemctl binary against the
// real idemgate in front of fake_upstream: sending under one key, parking
// what fails in the dead-letter queue and replaying it under its key, the
// admin commands, and https:// to a gateway with a TLS listener.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <csignal>
#include <regex>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "integration/harness.h"

namespace idemgate::testing {
namespace {

namespace json = boost::json;

struct CliRun {
  int code = -1;
  std::string out;
  std::string err;
};

class IdemctlTest : public GatewaySuite {
 protected:
  std::string Yaml(const std::string& listen = "127.0.0.1:0") {
    return GatewayConfigHead(fake_endpoint_,
                             {.listen = listen, .admin = "{ listen: 127.0.0.1:0, token_env: TEST_ADMIN_TOKEN }"}) +
           "  - id: api\n    match: { path_prefix: / }\n    upstream: fake\n    idempotency: { policy: required }\n";
  }

  // Runs idemctl with `args` (and the test's DLQ file), waiting for it.
  CliRun Idemctl(std::vector<std::string> args, std::vector<std::pair<std::string, std::string>> env = {}) {
    static int runs = 0;
    const std::string base = dir_.Join("idemctl-" + std::to_string(++runs));
    ProcessOptions options;
    options.stdout_path = base + ".out";
    options.stderr_path = base + ".err";
    options.env = std::move(env);
    options.env.emplace_back("IDEMCTL_DLQ", dir_.Join("dlq.sqlite"));
    CliRun run;
    auto process = Process::Start(IDEMCTL_BIN, args, options);
    EXPECT_TRUE(process.ok()) << process.status().ToString();
    if (!process.ok()) return run;
    const std::optional<ExitStatus> status = process->WaitExit(60s);
    EXPECT_TRUE(status.has_value() && status->exited) << "idemctl did not finish";
    if (status && status->exited) run.code = status->code;
    run.out = ReadFileOrEmpty(options.stdout_path);
    run.err = ReadFileOrEmpty(options.stderr_path);
    return run;
  }

  // The DLQ as `dlq list --json` shows it, without the newline ("[]" when nothing was parked).
  std::string DlqJson() {
    const CliRun listed = Idemctl({"dlq", "list", "--json"});
    EXPECT_EQ(listed.code, 0) << listed.err;
    std::string out = listed.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  std::string Url(const std::string& path) { return "http://" + gateway_->endpoint().ToString() + path; }
  std::string AdminUrl() { return "http://" + gateway_->admin().ToString(); }
};

// The DLQ entry id in idemctl's "parked as DLQ entry N" line.
std::string ParkedId(const std::string& err) {
  std::smatch m;
  if (std::regex_search(err, m, std::regex("parked as DLQ entry ([0-9]+)"))) return m[1];
  return "";
}

TEST_F(IdemctlTest, SendRetriesUnderOneKeyAndTheGatewayReplays) {
  StartGateway(Yaml());
  const CliRun first = Idemctl({"send", "-i", "-k", "order-7", "-H", "Content-Type: application/json", "-d",
                             R"({"amount":5})", Url("/echo/pay")});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("HTTP/1.1 200"), std::string::npos) << first.out;
  // fake_upstream echoes the key the gateway forwarded: the scoped one.
  EXPECT_NE(first.out.find("t-_:_:_:api:order-7"), std::string::npos) << first.out;
  const CliRun again = Idemctl({"send", "-i", "-k", "order-7", "-H", "Content-Type: application/json", "-d",
                             R"({"amount":5})", Url("/echo/pay")});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("Idempotent-Replayed: true"), std::string::npos) << again.out;
  EXPECT_EQ(Executions(), 1u);

  // Another payload under the key: 422 key-reused, not retried, parked.
  const CliRun reused = Idemctl({"send", "-k", "order-7", "-H", "Content-Type: application/json", "-d",
                              R"({"amount":6})", "--attempts", "3", Url("/echo/pay")});
  EXPECT_EQ(reused.code, 1);
  EXPECT_NE(reused.err.find("1 attempt,"), std::string::npos) << reused.err;
  EXPECT_FALSE(ParkedId(reused.err).empty()) << reused.err;
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdemctlTest, AFailureIsParkedAndItsReplayRunsOnceUnderTheOriginalKey) {
  // The gateway is not there yet: every attempt is refused, the request is parked.
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const CliRun failed = Idemctl({"send", "-k", "pay-42", "-d", "{}", "--attempts", "2", "--base-delay", "10ms", url});
  EXPECT_EQ(failed.code, 1);
  EXPECT_NE(failed.err.find("2 attempts"), std::string::npos) << failed.err;
  const std::string id = ParkedId(failed.err);
  ASSERT_FALSE(id.empty()) << failed.err;

  const CliRun listed = Idemctl({"dlq", "list", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  const json::value entries = json::parse(listed.out);
  ASSERT_EQ(entries.as_array().size(), 1u) << listed.out;
  const json::object& entry = entries.as_array()[0].as_object();
  EXPECT_EQ(entry.at("status").as_string(), "pending");
  EXPECT_EQ(entry.at("key").as_string(), "pay-42");
  EXPECT_EQ(entry.at("attempts").as_int64(), 2);
  const CliRun shown = Idemctl({"dlq", "show", id});
  ASSERT_EQ(shown.code, 0) << shown.err;
  EXPECT_EQ(json::parse(shown.out).as_object().at("url").as_string(), url);

  // Now the gateway runs on that port: the replay goes through once.
  refused->Close();
  StartGateway(Yaml("127.0.0.1:" + std::to_string(refused->port())));
  const CliRun replayed = Idemctl({"dlq", "replay", id});
  ASSERT_EQ(replayed.code, 0) << replayed.err;
  EXPECT_NE(replayed.out.find("t-_:_:_:api:pay-42"), std::string::npos) << replayed.out;
  EXPECT_EQ(Idemctl({"dlq", "list", "--status", "replayed", "--json"}).out.find("pay-42") != std::string::npos, true);
  // A second replay of the same entry is refused: it is no longer pending.
  const CliRun twice = Idemctl({"dlq", "replay", id});
  EXPECT_EQ(twice.code, 1);
  EXPECT_NE(twice.err.find("replayed"), std::string::npos) << twice.err;
  // And the client retrying by hand under the key gets the stored answer.
  const CliRun by_hand = Idemctl({"send", "-i", "-k", "pay-42", "-d", "{}", url});
  EXPECT_NE(by_hand.out.find("Idempotent-Replayed: true"), std::string::npos) << by_hand.out;
  EXPECT_EQ(Executions(), 1u);

  // Discard: only a pending entry.
  EXPECT_EQ(Idemctl({"dlq", "discard", id}).code, 1);
}

TEST_F(IdemctlTest, AdminCommandsReadAndPurgeKeys) {
  // A token no Authorization header could carry stops the start.
  for (const std::string bad : {"s3cret ", " s3cret", "s3c\tret"}) {
    auto g = GatewayProcess::Start(dir_, Yaml(), {{"TEST_ADMIN_TOKEN", bad}}, "bad-token");
    ASSERT_FALSE(g.ok()) << "'" << bad << "'";
    EXPECT_NE(g.status().ToString().find("admin.token_env: the token in TEST_ADMIN_TOKEN"), std::string::npos)
        << g.status().ToString();
  }
  StartGateway(Yaml(), {{"TEST_ADMIN_TOKEN", "s3cret"}});
  ASSERT_EQ(Idemctl({"send", "-k", "k-admin", "-d", "{}", Url("/echo/pay")}).code, 0);
  const std::string stored = "t-_:_:_:api:k-admin";
  const std::vector<std::pair<std::string, std::string>> token = {{"IDEMGATE_ADMIN_TOKEN", "s3cret"}};
  const std::vector<std::pair<std::string, std::string>> no_token = {{"IDEMGATE_ADMIN_TOKEN", ""}};
  // The gateway has an admin token: key calls need it (without one, idemctl
  // does not even ask).
  EXPECT_EQ(Idemctl({"keys", "get", stored, "--admin", AdminUrl()}, no_token).code, 2);
  const CliRun got = Idemctl({"keys", "get", stored, "--admin", AdminUrl()}, token);
  ASSERT_EQ(got.code, 0) << got.err;
  EXPECT_NE(got.out.find("completed"), std::string::npos) << got.out;

  EXPECT_EQ(Idemctl({"keys", "purge", stored, "--admin", AdminUrl()}, no_token).code, 2);
  const CliRun purged =
      Idemctl({"keys", "purge", stored, "--admin", AdminUrl(), "--token-env", "MY_TOKEN"}, {{"MY_TOKEN", "s3cret"}});
  EXPECT_EQ(purged.code, 0) << purged.out << purged.err;
  EXPECT_NE(purged.out.find("\"purged\":true"), std::string::npos) << purged.out;
  EXPECT_EQ(Idemctl({"keys", "get", stored, "--admin", AdminUrl()}, token).code, 1);

  const CliRun stats = Idemctl({"stats", "--admin", AdminUrl()}, token);
  ASSERT_EQ(stats.code, 0) << stats.err;
  EXPECT_NE(stats.out.find("\"api\""), std::string::npos) << stats.out;
  EXPECT_EQ(Idemctl({"stats", "--force", "--admin", AdminUrl()}, token).code, 2);
  EXPECT_EQ(Idemctl({"keys", "get", stored, "--force", "--admin", AdminUrl()}, token).code, 2);

  // A key whose request still runs is purged only with --force.
  std::jthread slow([&] { Send(KeyedPost("/slow?ms=3000", "k-running")); });
  ASSERT_TRUE(PollUntil([&] { return Executions() >= 2; }, 10s));
  const std::string running = "t-_:_:_:api:k-running";
  const CliRun refused = Idemctl({"keys", "purge", running, "--admin", AdminUrl()}, token);
  EXPECT_EQ(refused.code, 1) << refused.out << refused.err;
  EXPECT_NE(refused.out.find("key-in-flight"), std::string::npos) << refused.out;
  EXPECT_NE(refused.err.find("409"), std::string::npos) << refused.err;
  const CliRun forced = Idemctl({"keys", "purge", running, "--force", "--admin", AdminUrl()}, token);
  EXPECT_EQ(forced.code, 0) << forced.out << forced.err;
  EXPECT_NE(forced.out.find("\"state\":\"in_flight\""), std::string::npos) << forced.out;
}

TEST_F(IdemctlTest, SendsOverHttpsTrustingTheGivenCa) {
  auto pki = MakeTestPki(dir_.Join("pki"));
  ASSERT_TRUE(pki.ok()) << pki.status().ToString();
  StartGateway("tls: { cert_file: \"" + pki->server_cert + "\", key_file: \"" + pki->server_key + "\" }\n" + Yaml());
  const std::string url = "https://localhost:" + std::to_string(gateway_->endpoint().port) + "/echo/pay";
  const std::vector<std::pair<std::string, std::string>> no_env_ca = {{"IDEMCTL_CACERT", ""}};

  const CliRun first = Idemctl({"send", "-i", "--cacert", pki->ca_file, "-k", "tls-7", "-H",
                                "Content-Type: application/json", "-d", R"({"amount":7})", url},
                               no_env_ca);
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("HTTP/1.1 200"), std::string::npos) << first.out;
  EXPECT_NE(first.out.find("t-_:_:_:api:tls-7"), std::string::npos) << first.out;
  // The same key again, the CA from $IDEMCTL_CACERT this time: the stored response.
  const CliRun again = Idemctl({"send", "-i", "-k", "tls-7", "-H", "Content-Type: application/json", "-d",
                                R"({"amount":7})", url},
                               {{"IDEMCTL_CACERT", pki->ca_file}});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("Idempotent-Replayed: true"), std::string::npos) << again.out;
  EXPECT_EQ(Executions(), 1u);

  // The system's trust store does not know the test CA: every attempt fails
  // its handshake, and the request is parked.
  const CliRun untrusted =
      Idemctl({"send", "-k", "tls-8", "-d", "{}", "--attempts", "2", "--base-delay", "10ms", url}, no_env_ca);
  EXPECT_EQ(untrusted.code, 1);
  EXPECT_NE(untrusted.err.find("2 attempts"), std::string::npos) << untrusted.err;
  EXPECT_NE(untrusted.err.find("certificate verify failed"), std::string::npos) << untrusted.err;
  const std::string id = ParkedId(untrusted.err);
  ASSERT_FALSE(id.empty()) << untrusted.err;
  EXPECT_EQ(Executions(), 1u);
  // Replayed trusting the CA: it runs, once, under its key.
  const CliRun replayed = Idemctl({"dlq", "replay", id, "--cacert", pki->ca_file}, no_env_ca);
  ASSERT_EQ(replayed.code, 0) << replayed.err;
  EXPECT_NE(replayed.out.find("t-_:_:_:api:tls-8"), std::string::npos) << replayed.out;
  EXPECT_EQ(Executions(), 2u);

  // A TLS file that cannot be opened is known before anything is sent: a
  // usage error naming it, nothing sent or parked (as for -d @FILE).
  const std::string dlq_before = DlqJson();
  const std::string missing = dir_.Join("missing.pem");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad_files = {
      {{"--cacert", missing}, "--cacert " + missing + ": cannot read " + missing + ": No such file or directory"},
      {{"--cacert", dir_.path()}, "--cacert " + dir_.path() + ": " + dir_.path() + " is a directory"},
      {{"--client-cert", missing, "--client-key", pki->client_key}, "--client-cert " + missing + ": cannot read"},
      {{"--client-cert", pki->client_cert, "--client-key", missing}, "--client-key " + missing + ": cannot read"},
  };
  for (const auto& [bad, named] : bad_files) {
    std::vector<std::string> args = {"send", "-k", "tls-9", "-d", "{}", "--attempts", "3", url};
    args.insert(args.end(), bad.begin(), bad.end());
    const CliRun run = Idemctl(args, no_env_ca);
    EXPECT_EQ(run.code, 2) << named << ": " << run.err;
    EXPECT_NE(run.err.find(named), std::string::npos) << run.err;
    EXPECT_EQ(run.err.find("attempt"), std::string::npos) << run.err;
  }
  const CliRun from_env = Idemctl({"send", "-k", "tls-9", "-d", "{}", url}, {{"IDEMCTL_CACERT", dir_.Join("gone.pem")}});
  EXPECT_EQ(from_env.code, 2) << from_env.err;
  EXPECT_NE(from_env.err.find("$IDEMCTL_CACERT " + dir_.Join("gone.pem")), std::string::npos) << from_env.err;
  // The admin calls and a replay check them too (the replay before claiming its entry).
  EXPECT_EQ(Idemctl({"stats", "--admin", "https://127.0.0.1:1", "--cacert", missing}).code, 2);
  EXPECT_EQ(DlqJson(), dlq_before);
  EXPECT_EQ(Executions(), 2u);
  // A plain http:// request does not use them.
  const CliRun plain = Idemctl({"send", "-k", "tls-10", "-d", "{}", "http://" + fake_endpoint_.ToString() + "/echo"},
                               {{"IDEMCTL_CACERT", dir_.Join("gone.pem")}});
  EXPECT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(Executions(), 3u);
  // One that opens but holds no certificate fails the attempt at once (not
  // retried), and the request is parked.
  const std::string junk = dir_.Join("junk.pem");
  ASSERT_TRUE(WriteFile(junk, "not a certificate\n").ok());
  const CliRun unusable = Idemctl({"send", "-k", "tls-11", "--cacert", junk, "-d", "{}", "--attempts", "3", url});
  EXPECT_EQ(unusable.code, 1);
  EXPECT_NE(unusable.err.find("junk.pem"), std::string::npos) << unusable.err;
  EXPECT_NE(unusable.err.find("1 attempt,"), std::string::npos) << unusable.err;
  const std::string unusable_id = ParkedId(unusable.err);
  ASSERT_FALSE(unusable_id.empty()) << unusable.err;
  const CliRun replay_missing = Idemctl({"dlq", "replay", unusable_id, "--cacert", missing});
  EXPECT_EQ(replay_missing.code, 2) << replay_missing.err;
  const CliRun still = Idemctl({"dlq", "show", unusable_id});
  EXPECT_EQ(json::parse(still.out).as_object().at("status").as_string(), "pending") << still.out;
  EXPECT_EQ(json::parse(still.out).as_object().at("attempts").as_int64(), 1) << still.out;
  EXPECT_EQ(Executions(), 3u);

  // A client certificate needs its key, and the other way round.
  EXPECT_EQ(Idemctl({"send", "--client-cert", pki->client_cert, "-d", "{}", url}).code, 2);
  EXPECT_EQ(Idemctl({"stats", "--client-key", pki->client_key}).code, 2);
  const CliRun help = Idemctl({"--help"});
  EXPECT_NE(help.out.find("--cacert FILE"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--client-cert FILE"), std::string::npos) << help.out;
}

TEST_F(IdemctlTest, AnEmptyOrInvalidKeyIsAUsageErrorNotANewKey) {
  StartGateway(Yaml());
  // An empty -k (an unset shell variable) must not become a random key: run
  // twice, that would execute the backend twice.
  for (int run = 0; run < 2; ++run) {
    const CliRun empty = Idemctl({"send", "-k", "", "-d", "{}", Url("/echo/pay")});
    EXPECT_EQ(empty.code, 2) << empty.err;
    EXPECT_NE(empty.err.find("-k"), std::string::npos) << empty.err;
    EXPECT_NE(empty.err.find("empty"), std::string::npos) << empty.err;
  }
  const CliRun empty_derive = Idemctl({"send", "--derive", "", "-d", "{}", Url("/echo/pay")});
  EXPECT_EQ(empty_derive.code, 2) << empty_derive.err;
  // Keys the gateway would refuse (SPEC §3) are refused before anything is
  // sent or parked, naming the key and the rule.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"t-abc", "reserved"},
      {"order:42", "colon"},
      {"order 42", "[A-Za-z0-9._~-]"},
      {"caf\xc3\xa9", "[A-Za-z0-9._~-]"},
      {std::string(256, 'a'), "255"},
  };
  for (const auto& [key, why] : refused) {
    const CliRun bad = Idemctl({"send", "-k", key, "-d", "{}", Url("/echo/pay")});
    EXPECT_EQ(bad.code, 2) << key << ": " << bad.err;
    EXPECT_NE(bad.err.find(why), std::string::npos) << key << ": " << bad.err;
    EXPECT_NE(bad.err.find(key.substr(0, 3)), std::string::npos) << key << ": " << bad.err;
  }
  // The longest key the gateway takes goes through.
  const CliRun longest = Idemctl({"send", "-k", std::string(255, 'a'), "-d", "{}", Url("/echo/pay")});
  EXPECT_EQ(longest.code, 0) << longest.err;
  EXPECT_EQ(Executions(), 1u);
  EXPECT_EQ(DlqJson(), "[]");
}

// A -H line of the key header is the key (not dropped for a new key on each
// run, which would execute each run): as an sf-string or the bare key,
// checked as -k is.
TEST_F(IdemctlTest, AKeyHeaderGivenWithDashHIsTheKey) {
  StartGateway(Yaml());
  for (int run = 0; run < 2; ++run) {
    const CliRun sent = Idemctl({"send", "-H", "Idempotency-Key: \"order-9\"", "-d", "{}", Url("/echo/pay")});
    ASSERT_EQ(sent.code, 0) << sent.err;
    EXPECT_NE(sent.out.find("t-_:_:_:api:order-9"), std::string::npos) << sent.out;
  }
  // The bare key, any case of the name, and -k with the same key: the same key.
  EXPECT_EQ(Idemctl({"send", "-H", "idempotency-key: order-9", "-d", "{}", Url("/echo/pay")}).code, 0);
  EXPECT_EQ(Idemctl({"send", "-k", "order-9", "-H", "Idempotency-Key: \"order-9\"", "-d", "{}", Url("/echo/pay")}).code,
            0);
  EXPECT_EQ(Executions(), 1u);

  // Under --key-header, that header's -H line is the key: sent once, as an sf-string.
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  for (int run = 0; run < 2; ++run) {
    const CliRun sent = Idemctl({"send", "--key-header", "X-K", "-H", "x-k: v-1", "-d", "{}", echo});
    ASSERT_EQ(sent.code, 0) << sent.err;
    json::object o = json::parse(sent.out).as_object();
    EXPECT_EQ(Values(EchoedHeaders(o), "X-K"), std::vector<std::string>{"\"v-1\""}) << sent.out;
  }

  struct Case {
    std::vector<std::string> args;
    std::string named;
  };
  const std::vector<Case> refused = {
      {{"-k", "a-1", "-H", "Idempotency-Key: a-2"}, "differ"},
      {{"-H", "Idempotency-Key: a-1", "-H", "Idempotency-Key: a-1"}, "two"},
      {{"-H", "Idempotency-Key: \"\""}, "empty"},
      {{"-H", "Idempotency-Key:"}, "empty"},
      {{"-H", "Idempotency-Key: t-1"}, "reserved"},
      {{"-H", "Idempotency-Key: \"a-1"}, "closing quote"},
      {{"-H", "Idempotency-Key: \"a-1\";p=1"}, "follow"},
      {{"--key-v7", "-H", "Idempotency-Key: a-1"}, "only one"},
      {{"--key-header", "X-K", "-H", "X-K: a:1"}, "colon"},
  };
  for (const Case& c : refused) {
    std::vector<std::string> args = {"send", "-d", "{}"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    args.push_back(echo);
    const CliRun run = Idemctl(args);
    EXPECT_EQ(run.code, 2) << c.named << ": " << run.err;
    EXPECT_NE(run.err.find(c.named), std::string::npos) << c.named << ": " << run.err;
  }
  EXPECT_EQ(Executions(), 3u);
  EXPECT_EQ(DlqJson(), "[]");
}

TEST_F(IdemctlTest, RequestsThatCanNeverSucceedAreUsageErrorsNotParked) {
  // A port that refuses connections: anything that were sent would be
  // retried and parked (exit 1), not refused at once (exit 2).
  auto port = RefusedPort::Make();
  ASSERT_TRUE(port.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(port->port()) + "/echo/pay";
  struct Case {
    std::vector<std::string> args;
    std::string named;  // what the message must name
  };
  const std::vector<Case> cases = {
      {{"ftp://x"}, "ftp://x"},
      {{"http://h/a b"}, "space"},
      {{"--key-header", "", url}, "--key-header"},
      {{"-H", "Bad Name: v", url}, "Bad Name"},
      {{"-H", "X-Evil: a\r\nX-Injected: 1", url}, "X-Evil"},
      {{"-H", "X-Evil: a\nb", url}, "X-Evil"},
      {{"-H", "X-Ctl: a\x1b[2Jb", url}, "X-Ctl"},
      {{"-H", "Host: a.example", "-H", "host: b.example", url}, "two Host headers"},
      {{"-k", "k\xff", url}, "-k"},
      {{"-X", "PO ST", url}, "PO ST"},
      {{"-X", "", url}, "-X"},
      // Not the key header (it gives no key: a new one on every run, each of which would run).
      {{"-H", "Idempotency_Key: usk1", url}, "header Idempotency_Key differs from the key header Idempotency-Key"},
      {{"-k", "usk1", "-H", "idempotency_key: usk1", url}, "spell it Idempotency-Key"},
      {{"--key-header", "X-Idem", "-H", "X_Idem: usk1", url}, "spell it X-Idem"},
      // A key header that frames the request: sent, a server would refuse it (400) on every attempt.
      {{"--key-header", "Host", url}, "key header Host"},
      {{"--key-header", "content-length", url}, "key header content-length"},
      {{"--key-header", "Transfer-Encoding", "-k", "te-1", url}, "key header Transfer-Encoding"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"send", "-d", "{}", "--attempts", "2", "--base-delay", "1ms"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun run = Idemctl(args);
    EXPECT_EQ(run.code, 2) << c.named << ": " << run.err;
    EXPECT_NE(run.err.find(c.named), std::string::npos) << c.named << ": " << run.err;
    EXPECT_EQ(run.err.find("parked"), std::string::npos) << c.named << ": " << run.err;
    EXPECT_EQ(run.err.find("leftover"), std::string::npos) << c.named << ": " << run.err;
  }
  EXPECT_EQ(DlqJson(), "[]");
}

// `dlq release` of an entry whose replay is still running is refused (a
// second replay beside it could run the target twice), and the running
// replay records its result. `dlq list` shows who holds the entry.
TEST_F(IdemctlTest, ReleaseIsRefusedWhileTheReplayRuns) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/slow?ms=2500";
  const CliRun failed = Idemctl({"send", "-k", "slow-1", "-d", "{}", "--attempts", "1", url});
  ASSERT_EQ(failed.code, 1) << failed.err;
  const std::string id = ParkedId(failed.err);
  ASSERT_FALSE(id.empty()) << failed.err;
  refused->Close();
  StartGateway(Yaml("127.0.0.1:" + std::to_string(refused->port())));

  ProcessOptions options;
  options.stdout_path = dir_.Join("replay.out");
  options.stderr_path = dir_.Join("replay.err");
  options.env.emplace_back("IDEMCTL_DLQ", dir_.Join("dlq.sqlite"));
  auto replay = Process::Start(IDEMCTL_BIN, {"dlq", "replay", id}, options);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  bool replaying = false;
  for (int i = 0; i < 200 && !replaying; ++i) {
    replaying = DlqJson().find("\"replaying\"") != std::string::npos;
    if (!replaying) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(replaying);
  const json::object claim = json::parse(DlqJson()).as_array()[0].as_object().at("claim").as_object();
  EXPECT_EQ(claim.at("pid").as_int64(), replay->pid());
  const CliRun release = Idemctl({"dlq", "release", id});
  EXPECT_EQ(release.code, 1) << release.err;
  EXPECT_NE(release.err.find("still running"), std::string::npos) << release.err;
  EXPECT_NE(release.err.find("--force"), std::string::npos) << release.err;
  EXPECT_EQ(Idemctl({"dlq", "replay", id}).code, 1);  // still claimed

  const std::optional<ExitStatus> done = replay->WaitExit(60s);
  ASSERT_TRUE(done.has_value() && done->exited);
  EXPECT_EQ(done->code, 0) << ReadFileOrEmpty(options.stderr_path);
  EXPECT_NE(DlqJson().find("\"replayed\""), std::string::npos);
  EXPECT_EQ(Executions(), 1u);
}

// -d @FILE that cannot be read (a directory, a missing file) is a usage
// error with nothing sent, never an empty body; -d @- reads stdin.
TEST_F(IdemctlTest, BodyFromAFileOrStdin) {
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  for (const std::string& bad : {dir_.path(), dir_.Join("missing.json"), std::string()}) {
    const CliRun run = Idemctl({"send", "-k", "b-1", "-d", "@" + bad, echo});
    EXPECT_EQ(run.code, 2) << bad << ": " << run.err;
    EXPECT_NE(run.err.find("-d @" + bad), std::string::npos) << run.err;
  }
  const CliRun directory = Idemctl({"send", "-k", "b-1", "-d", "@" + dir_.path(), echo});
  EXPECT_NE(directory.err.find("is a directory"), std::string::npos) << directory.err;
  EXPECT_EQ(Executions(), 0u);
  EXPECT_EQ(DlqJson(), "[]");

  const std::string body("{\"a\":1}\n\xff\0end", 13);
  const std::string file = dir_.Join("body.bin");
  ASSERT_TRUE(WriteFile(file, body).ok());
  ProcessOptions options;
  options.stdout_path = dir_.Join("stdin.out");
  options.stderr_path = dir_.Join("stdin.err");
  options.env = {{"IDEMCTL_DLQ", dir_.Join("dlq.sqlite")}, {"IDEMCTL_TEST_STDIN", file}};
  auto send = Process::Start("/bin/sh", {"-c", "exec \"$0\" \"$@\" < \"$IDEMCTL_TEST_STDIN\"", IDEMCTL_BIN, "send",
                                         "-k", "b-2", "-d", "@-", echo},
                             options);
  ASSERT_TRUE(send.ok()) << send.status().ToString();
  const std::optional<ExitStatus> done = send->WaitExit(60s);
  ASSERT_TRUE(done.has_value() && done->exited);
  EXPECT_EQ(done->code, 0) << ReadFileOrEmpty(options.stderr_path);
  const json::object echoed = json::parse(ReadFileOrEmpty(options.stdout_path)).as_object();
  EXPECT_EQ(echoed.at("body_length").to_number<std::int64_t>(), 13);
  EXPECT_EQ(echoed.at("body_base64").as_string(), "eyJhIjoxfQr/AGVuZA==");
  EXPECT_EQ(Executions(), 1u);
}

// A duration too long for the clocks is a usage error (every attempt would
// otherwise "time out" at once, after the backend ran it); up to 365d works.
TEST_F(IdemctlTest, DurationsAreBounded) {
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  for (const std::string option : {"--timeout", "--base-delay", "--max-delay"}) {
    for (const std::string too_long : {"9223372036854ms", "1000000d", "366d", "8785h"}) {
      const CliRun run = Idemctl({"send", "-k", "t-long", "-d", "{}", option, too_long, echo});
      EXPECT_EQ(run.code, 2) << option << " " << too_long << ": " << run.err;
      EXPECT_NE(run.err.find(option + ": " + too_long + " is too long"), std::string::npos) << run.err;
    }
  }
  EXPECT_EQ(Executions(), 0u);
  const CliRun longest = Idemctl({"send", "-k", "d-365", "-d", "{}", "--timeout", "365d", "--max-delay", "365d", echo});
  EXPECT_EQ(longest.code, 0) << longest.err;
  EXPECT_EQ(Executions(), 1u);
  EXPECT_EQ(DlqJson(), "[]");
}

// -h and --help ask for help only in an option's place: as an option's
// value they are that value (and the request is sent).
TEST_F(IdemctlTest, HelpOnlyInAnOptionsPlace) {
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  for (const std::string help : {"--help", "-h"}) {
    const CliRun sent = Idemctl({"send", "-k", "p2-" + std::to_string(help.size()), "-d", help, echo});
    ASSERT_EQ(sent.code, 0) << sent.err;
    EXPECT_EQ(sent.out.find("Usage:"), std::string::npos) << sent.out;
    EXPECT_EQ(json::parse(sent.out).as_object().at("body").as_string(), help) << sent.out;
  }
  EXPECT_EQ(Executions(), 2u);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"send", "-k", "p3", echo, "--help"}, {"send", "-h", "-d", "{}", echo},
        {"--dlq", "--help", "dlq", "list", "-h"}}) {
    const CliRun help = Idemctl(args);
    EXPECT_EQ(help.code, 0) << help.err;
    EXPECT_NE(help.out.find("Usage:"), std::string::npos) << help.out;
  }
  EXPECT_EQ(Executions(), 2u);
}

// dlq show and dlq list --json write valid JSON whatever bytes a request
// holds: a body that is not UTF-8 as body_base64, such a header name or
// value as {"base64": ...}.
TEST_F(IdemctlTest, DlqJsonIsValidForAnyBytes) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const std::string file = dir_.Join("binary.bin");
  ASSERT_TRUE(WriteFile(file, std::string("\xff\0bin\xc3", 6)).ok());
  const CliRun binary = Idemctl({"send", "-k", "bin-1", "--attempts", "1", "-H", "X-Latin1: caf\xe9", "-H",
                                 "X-Utf8: caf\xc3\xa9", "-d", "@" + file, url});
  ASSERT_EQ(binary.code, 1) << binary.err;
  const CliRun text = Idemctl({"send", "-k", "bin-2", "--attempts", "1", "-d", "caf\xc3\xa9", url});
  ASSERT_EQ(text.code, 1) << text.err;

  const CliRun shown = Idemctl({"dlq", "show", ParkedId(binary.err)});
  ASSERT_EQ(shown.code, 0) << shown.err;
  boost::system::error_code ec;
  const json::value parsed = json::parse(shown.out, ec);
  ASSERT_FALSE(ec) << ec.message() << ": " << shown.out;
  const json::object& entry = parsed.as_object();
  EXPECT_FALSE(entry.contains("body"));
  EXPECT_EQ(entry.at("body_base64").as_string(), "/wBiaW7D");
  const json::array& headers = entry.at("headers").as_array();
  ASSERT_EQ(headers.size(), 2u) << shown.out;
  EXPECT_EQ(headers[0].as_array()[0].as_string(), "X-Latin1");
  EXPECT_EQ(headers[0].as_array()[1].as_object().at("base64").as_string(), "Y2Fm6Q==");
  EXPECT_EQ(headers[1].as_array()[1].as_string(), "caf\xc3\xa9");

  const CliRun shown_text = Idemctl({"dlq", "show", ParkedId(text.err)});
  ASSERT_EQ(shown_text.code, 0) << shown_text.err;
  const json::object text_entry = json::parse(shown_text.out).as_object();
  EXPECT_EQ(text_entry.at("body").as_string(), "caf\xc3\xa9");
  EXPECT_FALSE(text_entry.contains("body_base64"));

  const CliRun listed = Idemctl({"dlq", "list", "--json"});
  ASSERT_EQ(listed.code, 0) << listed.err;
  EXPECT_EQ(json::parse(listed.out, ec).as_array().size(), 2u);
  EXPECT_FALSE(ec);
}

// The default queue ($XDG_DATA_HOME/idemctl/dlq.sqlite) holds request
// headers and bodies: its directory is made 0700 (and one an older idemctl
// made 0755 is closed), the file 0600.
TEST_F(IdemctlTest, TheDefaultQueueIsTheUsersAlone) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const mode_t old_umask = ::umask(022);
  for (const bool existing : {false, true}) {
    SCOPED_TRACE(existing);
    const std::string data = dir_.Join(existing ? "xdg-existing" : "xdg-new");
    if (existing) {
      ASSERT_TRUE(std::filesystem::create_directories(data + "/idemctl"));
      ASSERT_EQ(::chmod((data + "/idemctl").c_str(), 0755), 0);
    }
    ProcessOptions options;
    options.stdout_path = data + ".out";
    options.stderr_path = data + ".err";
    options.env = {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", data}};
    auto send = Process::Start(IDEMCTL_BIN, {"send", "-k", "perm-1", "--attempts", "1", "-d", "{}", url}, options);
    ASSERT_TRUE(send.ok()) << send.status().ToString();
    const std::optional<ExitStatus> done = send->WaitExit(60s);
    ASSERT_TRUE(done.has_value() && done->exited);
    EXPECT_EQ(done->code, 1) << ReadFileOrEmpty(options.stderr_path);
    EXPECT_FALSE(ParkedId(ReadFileOrEmpty(options.stderr_path)).empty()) << ReadFileOrEmpty(options.stderr_path);
    struct stat st {};
    ASSERT_EQ(::stat((data + "/idemctl").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    ASSERT_EQ(::stat((data + "/idemctl/dlq.sqlite").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  ::umask(old_umask);
}

TEST_F(IdemctlTest, SmallUsageChecksAndVerboseAttempts) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const CliRun no_verb = Idemctl({"dlq"});
  EXPECT_EQ(no_verb.code, 2);
  EXPECT_NE(no_verb.err.find("discard or release"), std::string::npos) << no_verb.err;
  // The gateway refuses lower-case methods on every attempt: never sent, never parked.
  for (const std::string method : {"post", "Post"}) {
    const CliRun run = Idemctl({"send", "-X", method, "-k", "m-1", "-d", "{}", "--attempts", "1", url});
    EXPECT_EQ(run.code, 2) << method << ": " << run.err;
    EXPECT_NE(run.err.find("-X " + method + ": a method with lower-case letters"), std::string::npos) << run.err;
  }
  EXPECT_EQ(DlqJson(), "[]");
  const std::vector<std::pair<std::string, std::string>> token = {{"IDEMGATE_ADMIN_TOKEN", "s3cret"}};
  for (const std::string verb : {"get", "purge"}) {
    const CliRun run = Idemctl({"keys", verb, "", "--admin", "http://127.0.0.1:" + std::to_string(refused->port())},
                               token);
    EXPECT_EQ(run.code, 2) << verb << ": " << run.err;
    EXPECT_NE(run.err.find("needs a stored key"), std::string::npos) << run.err;
  }

  // -v: each attempt's outcome, and the wait after it.
  const CliRun failing =
      Idemctl({"send", "-v", "-k", "v-1", "--no-dlq", "--attempts", "2", "--base-delay", "1ms", "-d", "{}", url});
  EXPECT_EQ(failing.code, 1);
  const std::string where = "127.0.0.1:" + std::to_string(refused->port());
  EXPECT_TRUE(std::regex_search(failing.err, std::regex("idemctl: attempt 1: connection refused by " + where +
                                                        "; retrying in [01] ms\n")))
      << failing.err;
  EXPECT_NE(failing.err.find("idemctl: attempt 2: connection refused by " + where + "\n"), std::string::npos)
      << failing.err;
  const CliRun ok = Idemctl({"send", "-v", "-k", "v-2", "-d", "{}", "http://" + fake_endpoint_.ToString() + "/echo"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.err.find("idemctl: attempt 1: 200 OK\n"), std::string::npos) << ok.err;
}

// SIGTERM or SIGINT during send (here// SIGTERM or SIGINT during send (here in an attempt that would take 30 s)
// does not lose the request: idemctl stops, parks it under its key and says
// both, exiting 1 as for any parked failure. A new key is said before the
// first attempt, for a kill that leaves no time to park.
TEST_F(IdemctlTest, ASignalDuringSendParksTheRequestUnderItsKey) {
  const std::string slow = "http://" + fake_endpoint_.ToString() + "/slow?ms=30000";
  std::uint64_t sent = 0;
  for (const int sig : {SIGTERM, SIGINT}) {
    SCOPED_TRACE(sig);
    ProcessOptions options;
    options.stdout_path = dir_.Join("signal-" + std::to_string(sig) + ".out");
    options.stderr_path = dir_.Join("signal-" + std::to_string(sig) + ".err");
    options.env.emplace_back("IDEMCTL_DLQ", dir_.Join("dlq.sqlite"));
    auto send = Process::Start(IDEMCTL_BIN, {"send", "-d", "{}", "--timeout", "120s", slow}, options);
    ASSERT_TRUE(send.ok()) << send.status().ToString();
    ++sent;
    for (int i = 0; i < 3000 && Executions() < sent; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(Executions(), sent);  // the attempt is in progress
    std::smatch m;
    const std::string said = ReadFileOrEmpty(options.stderr_path);
    ASSERT_TRUE(std::regex_search(said, m, std::regex("new key ([0-9a-f-]{36})"))) << said;
    const std::string key = m[1];

    ASSERT_TRUE(send->Signal(sig).ok());
    const std::optional<ExitStatus> done = send->WaitExit(60s);
    ASSERT_TRUE(done.has_value());
    ASSERT_TRUE(done->exited) << "ended by the signal";
    EXPECT_EQ(done->code, 1);
    const std::string err = ReadFileOrEmpty(options.stderr_path);
    EXPECT_NE(err.find("key " + key + ", 1 attempt, failed: interrupted"), std::string::npos) << err;
    const std::string id = ParkedId(err);
    ASSERT_FALSE(id.empty()) << err;
    const CliRun shown = Idemctl({"dlq", "show", id});
    ASSERT_EQ(shown.code, 0) << shown.err;
    const json::object entry = json::parse(shown.out).as_object();
    EXPECT_EQ(entry.at("key").as_string(), key);
    EXPECT_EQ(entry.at("status").as_string(), "pending");
    EXPECT_NE(std::string(entry.at("error").as_string()).find("interrupted"), std::string::npos) << shown.out;
  }
}

// Entry ids are decimal numbers only, checked before the queue is opened, so
// a mistyped command creates no queue file.
TEST_F(IdemctlTest, DlqArgumentsAreCheckedStrictlyBeforeTheQueueIsOpened) {
  const std::string dlq = dir_.Join("dlq.sqlite");
  for (const std::string bad : {"99999999999999999999", "9223372036854775808", " 5", "+5", "5 ", "0x5", "abc", "0", ""}) {
    const CliRun run = Idemctl({"dlq", "replay", bad});
    EXPECT_EQ(run.code, 2) << "'" << bad << "': " << run.err;
    EXPECT_NE(run.err.find("entry id"), std::string::npos) << run.err;
  }
  EXPECT_EQ(Idemctl({"dlq", "bogus"}).code, 2);
  EXPECT_EQ(Idemctl({"dlq", "show"}).code, 2);
  EXPECT_EQ(Idemctl({"dlq", "list", "--status", "nope"}).code, 2);
  EXPECT_FALSE(std::filesystem::exists(dlq));
  // The largest id is accepted (and not found).
  const CliRun largest = Idemctl({"dlq", "show", "9223372036854775807"});
  EXPECT_EQ(largest.code, 1) << largest.err;
  EXPECT_NE(largest.err.find("no dead letter 9223372036854775807"), std::string::npos) << largest.err;
  // Only send creates a queue: the commands on entries, and list, leave none behind.
  EXPECT_EQ(Idemctl({"dlq", "replay", "1"}).code, 1);
  EXPECT_EQ(Idemctl({"dlq", "discard", "1"}).code, 1);
  EXPECT_EQ(Idemctl({"dlq", "release", "1"}).code, 1);
  const CliRun none = Idemctl({"dlq", "list", "--json"});
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_EQ(none.out, "[]\n");
  EXPECT_NE(none.err.find("there is none at " + dlq), std::string::npos) << none.err;
  EXPECT_FALSE(std::filesystem::exists(dlq));
  // A queue in a missing directory is none either, and the directory is named.
  const CliRun missing = Idemctl({"dlq", "list", "--dlq", dir_.Join("nowhere/dlq.sqlite")});
  EXPECT_EQ(missing.code, 0) << missing.err;
  EXPECT_NE(missing.err.find(dir_.Join("nowhere") + " does not exist"), std::string::npos) << missing.err;
  const CliRun no_entry = Idemctl({"dlq", "discard", "3", "--dlq", dir_.Join("nowhere/dlq.sqlite")});
  EXPECT_EQ(no_entry.code, 1);
  EXPECT_NE(no_entry.err.find("no dead letter 3"), std::string::npos) << no_entry.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.Join("nowhere")));
}

// Only send makes the default queue's directories: the dlq commands need no
// queue that does not exist, and make none (run by root with a user's HOME,
// they would leave directories the user cannot enter, breaking a later send).
TEST_F(IdemctlTest, DlqCommandsMakeNoDirectoryForTheDefaultQueue) {
  const std::string home = dir_.Join("home-dlq");
  ASSERT_TRUE(std::filesystem::create_directories(home));
  const std::string queue = home + "/.local/share/idemctl/dlq.sqlite";
  const std::vector<std::pair<std::vector<std::string>, int>> commands = {
      {{"dlq", "list"}, 0},           {{"dlq", "list", "--json"}, 0}, {{"dlq", "show", "1"}, 1},
      {{"dlq", "replay", "1"}, 1},    {{"dlq", "discard", "1"}, 1},   {{"dlq", "release", "1"}, 1},
  };
  int runs = 0;
  for (const auto& [args, code] : commands) {
    SCOPED_TRACE(args[1]);
    ProcessOptions options;
    options.stdout_path = dir_.Join("home-dlq-" + std::to_string(++runs) + ".out");
    options.stderr_path = dir_.Join("home-dlq-" + std::to_string(runs) + ".err");
    options.env = {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", ""}, {"HOME", home}};
    auto process = Process::Start(IDEMCTL_BIN, args, options);
    ASSERT_TRUE(process.ok()) << process.status().ToString();
    const std::optional<ExitStatus> done = process->WaitExit(60s);
    ASSERT_TRUE(done.has_value() && done->exited);
    const std::string err = ReadFileOrEmpty(options.stderr_path);
    EXPECT_EQ(done->code, code) << err;
    EXPECT_NE(err.find("there is none at " + queue), std::string::npos) << err;
    if (code == 1) {
      EXPECT_NE(err.find("no dead letter 1"), std::string::npos) << err;
    }
    EXPECT_FALSE(std::filesystem::exists(home + "/.local")) << err;
  }
}

// A DLQ that cannot be opened: the request is not sent (a failure could not
// be parked), and the exit status says it is not parked (3, not 1, which
// means parked).
TEST_F(IdemctlTest, ADlqThatCannotBeOpenedSendsNothingAndSaysNotParked) {
  StartGateway(Yaml());
  const std::string bad = dir_.Join("not-a-database");
  ASSERT_TRUE(WriteFile(bad, std::string(4096, 'x')).ok());
  const CliRun run = Idemctl({"send", "-k", "k-nodlq", "-d", "{}", "--dlq", bad, Url("/echo/pay")});
  EXPECT_EQ(run.code, 3) << run.err;
  EXPECT_NE(run.err.find("nothing was sent and nothing parked"), std::string::npos) << run.err;
  EXPECT_EQ(Executions(), 0u);
  // --no-dlq sends it.
  EXPECT_EQ(Idemctl({"send", "-k", "k-nodlq", "-d", "{}", "--dlq", bad, "--no-dlq", Url("/echo/pay")}).code, 0);
  EXPECT_EQ(Executions(), 1u);
}

TEST_F(IdemctlTest, KeyCommandsWithoutTheTokenSaySoAndSendNothing) {
  StartGateway(Yaml(), {{"TEST_ADMIN_TOKEN", "s3cret"}});
  const std::string stored = "t-_:_:_:api:k-none";
  const CliRun unset = Idemctl({"--token-env", "IDEMCTL_TEST_UNSET_VAR", "keys", "get", stored, "--admin", AdminUrl()});
  EXPECT_EQ(unset.code, 2) << unset.err;
  EXPECT_NE(unset.err.find("IDEMCTL_TEST_UNSET_VAR"), std::string::npos) << unset.err;
  EXPECT_NE(unset.err.find("unset"), std::string::npos) << unset.err;
  EXPECT_EQ(unset.out, "");
  const CliRun empty =
      Idemctl({"keys", "purge", stored, "--admin", AdminUrl(), "--token-env", "MY_TOKEN"}, {{"MY_TOKEN", ""}});
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_NE(empty.err.find("MY_TOKEN"), std::string::npos) << empty.err;
  EXPECT_NE(empty.err.find("empty"), std::string::npos) << empty.err;
  const CliRun by_default = Idemctl({"keys", "get", stored, "--admin", AdminUrl()}, {{"IDEMGATE_ADMIN_TOKEN", ""}});
  EXPECT_EQ(by_default.code, 2) << by_default.err;
  EXPECT_NE(by_default.err.find("IDEMGATE_ADMIN_TOKEN"), std::string::npos) << by_default.err;
  // A token that is set but wrong is the gateway's to refuse: exit 1.
  const CliRun wrong = Idemctl({"keys", "get", stored, "--admin", AdminUrl()}, {{"IDEMGATE_ADMIN_TOKEN", "nope"}});
  EXPECT_EQ(wrong.code, 1) << wrong.err;
  EXPECT_NE(wrong.out.find("unauthenticated"), std::string::npos) << wrong.out;
  // stats needs no token.
  const CliRun stats =
      Idemctl({"stats", "--admin", AdminUrl(), "--token-env", "IDEMCTL_TEST_UNSET_VAR"});
  EXPECT_EQ(stats.code, 0) << stats.err;
}

// An option a command does not take is refused (exit 2), naming it, rather
// than ignored: --force anywhere but dlq release and keys purge, send's
// request options on dlq replay (which sends the request as it was parked).
TEST_F(IdemctlTest, OptionsACommandDoesNotTakeAreRefused) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const CliRun parked = Idemctl({"send", "-k", "opt-1", "-d", "{}", "--attempts", "1", url});
  ASSERT_EQ(parked.code, 1) << parked.err;
  const std::string id = ParkedId(parked.err);
  ASSERT_FALSE(id.empty()) << parked.err;
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";

  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"send", "-d", "{}", echo}, {"dlq", "list"}, {"dlq", "show", id},
        {"dlq", "replay", id}, {"dlq", "discard", id}, {"key", "new"}, {"key", "derive", "a", "b", "c", "d", "e"},
        {"stats"}, {"keys", "get", "t-x"}}) {
    std::vector<std::string> args = command;
    args.push_back("--force");
    const CliRun run = Idemctl(args, {{"IDEMGATE_ADMIN_TOKEN", "t"}});
    EXPECT_EQ(run.code, 2) << command[0] << " " << command[1] << ": " << run.err;
    EXPECT_NE(run.err.find("does not take --force (only dlq release and keys purge do)"), std::string::npos)
        << run.err;
  }
  const std::vector<std::vector<std::string>> request_options = {
      {"-k", "other"}, {"--key", "other"}, {"-d", "{\"a\":1}"}, {"--data", "x"}, {"-H", "X-A: 1"}, {"-X", "PUT"},
      {"--key-v7"}, {"--derive", "a:b:c:d:e"}, {"--key-header", "X-K"}};
  for (const auto& option : request_options) {
    std::vector<std::string> args = {"dlq", "replay", id};
    args.insert(args.end(), option.begin(), option.end());
    const CliRun run = Idemctl(args);
    EXPECT_EQ(run.code, 2) << option[0] << ": " << run.err;
    EXPECT_NE(run.err.find("dlq replay does not take " + option[0] + ": a replay sends the request as it was parked"),
              std::string::npos)
        << run.err;
  }
  EXPECT_EQ(Idemctl({"dlq", "list", "-k", "x"}).code, 2);
  EXPECT_EQ(Idemctl({"dlq", "show", id, "--status", "pending"}).code, 2);
  EXPECT_EQ(Idemctl({"send", "--json", "-d", "{}", echo}).code, 2);
  EXPECT_EQ(Idemctl({"key", "new", "--no-dlq"}).code, 2);
  EXPECT_EQ(Idemctl({"dlq", "list", "--no-dlq"}).code, 2);
  const json::object entry = json::parse(Idemctl({"dlq", "show", id}).out).as_object();
  EXPECT_EQ(entry.at("status").as_string(), "pending");
  EXPECT_EQ(entry.at("attempts").as_int64(), 1);
  EXPECT_EQ(Executions(), 0u);

  // The retry, output and TLS options go with replay (and any command).
  const CliRun replay = Idemctl({"dlq", "replay", id, "-v", "-i", "--attempts", "2", "--base-delay", "1ms",
                                 "--cacert", dir_.Join("unused.pem")});
  EXPECT_EQ(replay.code, 1) << replay.err;
  EXPECT_NE(replay.err.find("idemctl: attempt 2: connection refused"), std::string::npos) << replay.err;
  EXPECT_EQ(Idemctl({"key", "new", "--attempts", "2", "--dlq", dir_.Join("other.sqlite")}).code, 0);
  EXPECT_EQ(Idemctl({"key", "new", "--key-v7"}).code, 0);
}

// An option with one value given twice is refused (exit 2), naming it,
// instead of the second silently replacing the first: nothing is sent.
TEST_F(IdemctlTest, AnOptionWithAValueIsGivenOnce) {
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-k", "a-1", "-k", "a-2"}, "-k is given twice"},
      {{"-k", "a-1", "--key", "a-1"}, "-k and --key (the same option) are both given"},
      {{"--derive", "a:b:c:d:e", "--derive", "a:b:c:d:f"}, "--derive is given twice"},
      {{"-d", "{}", "--data", "[]"}, "-d and --data (the same option) are both given"},
      {{"-X", "PUT", "-X", "POST"}, "-X is given twice"},
      {{"--key-header", "X-A", "--key-header", "X-B"}, "--key-header is given twice"},
      {{"--dlq", dir_.Join("a.sqlite"), "--dlq", dir_.Join("b.sqlite")}, "--dlq is given twice"},
      {{"--timeout", "1s", "--timeout", "2s"}, "--timeout is given twice"},
      {{"--attempts", "1", "--attempts", "2"}, "--attempts is given twice"},
      {{"--cacert", "a.pem", "--cacert", "b.pem"}, "--cacert is given twice"},
      {{"--token-env", "A", "--token-env", "B"}, "--token-env is given twice"},
  };
  for (const auto& [options, named] : cases) {
    std::vector<std::string> args = {"send"};
    args.insert(args.end(), options.begin(), options.end());
    if (std::find(options.begin(), options.end(), "-d") == options.end()) {
      args.insert(args.end(), {"--data", "{}"});
    }
    args.push_back(echo);
    const CliRun run = Idemctl(args);
    EXPECT_EQ(run.code, 2) << named << ": " << run.err;
    EXPECT_NE(run.err.find(named), std::string::npos) << run.err;
  }
  EXPECT_EQ(Executions(), 0u);
  // -H repeats; so do flags.
  const CliRun headers = Idemctl({"send", "-v", "-v", "-k", "h-1", "-H", "X-A: 1", "-H", "X-B: 2", "-d", "{}", echo});
  EXPECT_EQ(headers.code, 0) << headers.err;
  EXPECT_EQ(Executions(), 1u);
}

// The parts of a derived key may not be empty (an unset shell variable, most likely).
TEST_F(IdemctlTest, DerivedKeysNeedEveryPart) {
  const std::string echo = "http://" + fake_endpoint_.ToString() + "/echo";
  const CliRun inline_empty = Idemctl({"send", "--derive", "billing::invoice-9:pay:v1", "-d", "{}", echo});
  EXPECT_EQ(inline_empty.code, 2) << inline_empty.err;
  EXPECT_NE(inline_empty.err.find("--derive billing::invoice-9:pay:v1: the subject is empty"), std::string::npos)
      << inline_empty.err;
  EXPECT_EQ(Idemctl({"send", "--derive", ":a:b:c:d", "-d", "{}", echo}).code, 2);
  EXPECT_EQ(Idemctl({"send", "--derive", "a:b:c::d", "-d", "{}", echo}).code, 2);
  const CliRun derive_empty = Idemctl({"key", "derive", "billing", "alice", "invoice-9", "pay", ""});
  EXPECT_EQ(derive_empty.code, 2) << derive_empty.err;
  EXPECT_NE(derive_empty.err.find("key derive: the version is empty"), std::string::npos) << derive_empty.err;
  EXPECT_EQ(derive_empty.out, "");
  EXPECT_EQ(Executions(), 0u);
  EXPECT_EQ(DlqJson(), "[]");
}

// A replay whose entry was released (forced) while it ran still shows the
// answer it got, says that its result was not recorded, and exits 1.
TEST_F(IdemctlTest, AnUnrecordedReplayStillPrintsTheResponse) {
  const std::string slow = "http://" + fake_endpoint_.ToString() + "/slow?ms=2500";
  const CliRun failed = Idemctl({"send", "-k", "slow-2", "-d", "{}", "--attempts", "1", "--timeout", "100ms", slow});
  ASSERT_EQ(failed.code, 1) << failed.err;
  const std::string id = ParkedId(failed.err);
  ASSERT_FALSE(id.empty()) << failed.err;

  ProcessOptions options;
  options.stdout_path = dir_.Join("unrecorded.out");
  options.stderr_path = dir_.Join("unrecorded.err");
  options.env.emplace_back("IDEMCTL_DLQ", dir_.Join("dlq.sqlite"));
  auto replay = Process::Start(IDEMCTL_BIN, {"dlq", "replay", "-i", id}, options);
  ASSERT_TRUE(replay.ok()) << replay.status().ToString();
  ASSERT_TRUE(PollUntil([&] { return DlqJson().find("\"replaying\"") != std::string::npos; }, 10s));
  const CliRun release = Idemctl({"dlq", "release", id, "--force"});
  ASSERT_EQ(release.code, 0) << release.err;
  const std::optional<ExitStatus> done = replay->WaitExit(60s);
  ASSERT_TRUE(done.has_value() && done->exited);
  EXPECT_EQ(done->code, 1);
  const std::string out = ReadFileOrEmpty(options.stdout_path);
  EXPECT_TRUE(out.starts_with("HTTP/1.1 200 OK\r\n")) << out;
  EXPECT_NE(out.find("\"slept_ms\":2500"), std::string::npos) << out;
  const std::string err = ReadFileOrEmpty(options.stderr_path);
  EXPECT_NE(err.find("was replayed (ok) but the result was not recorded"), std::string::npos) << err;
  EXPECT_NE(DlqJson().find("\"pending\""), std::string::npos);
}

// $XDG_DATA_HOME counts only as an absolute path (the XDG Base Directory
// specification: a relative one is ignored, for ~/.local/share); the
// directories idemctl makes on the way are 0700, as the specification asks.
TEST_F(IdemctlTest, TheDefaultQueueIgnoresARelativeXdgDataHome) {
  auto refused = RefusedPort::Make();
  ASSERT_TRUE(refused.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string(refused->port()) + "/echo/pay";
  const std::string home = dir_.Join("home");
  ASSERT_TRUE(std::filesystem::create_directories(home));
  const std::string relative = "idemctl-test-relative-xdg-" + std::to_string(::getpid());
  const mode_t old_umask = ::umask(022);
  ProcessOptions options;
  options.stdout_path = dir_.Join("xdg.out");
  options.stderr_path = dir_.Join("xdg.err");
  options.env = {{"IDEMCTL_DLQ", ""}, {"XDG_DATA_HOME", relative}, {"HOME", home}};
  auto send = Process::Start(IDEMCTL_BIN, {"send", "-k", "xdg-1", "--attempts", "1", "-d", "{}", url}, options);
  ::umask(old_umask);
  ASSERT_TRUE(send.ok()) << send.status().ToString();
  const std::optional<ExitStatus> done = send->WaitExit(60s);
  ASSERT_TRUE(done.has_value() && done->exited);
  EXPECT_EQ(done->code, 1) << ReadFileOrEmpty(options.stderr_path);
  const bool used_relative = std::filesystem::exists(relative);
  std::filesystem::remove_all(relative);
  EXPECT_FALSE(used_relative);
  EXPECT_TRUE(std::filesystem::exists(home + "/.local/share/idemctl/dlq.sqlite"));
  for (const std::string made : {"/.local", "/.local/share", "/.local/share/idemctl"}) {
    struct stat st {};
    ASSERT_EQ(::stat((home + made).c_str(), &st), 0) << made;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << made;
  }
}

TEST_F(IdemctlTest, KeysAndUsage) {
  const CliRun v4 = Idemctl({"key", "new"});
  EXPECT_EQ(v4.code, 0);
  EXPECT_TRUE(std::regex_match(v4.out, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n")))
      << v4.out;
  const CliRun v7 = Idemctl({"key", "new", "--key-v7"});
  EXPECT_TRUE(std::regex_match(v7.out, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n")))
      << v7.out;
  const CliRun d1 = Idemctl({"key", "derive", "billing", "user:alice", "invoice-9", "pay", "v1"});
  const CliRun d2 = Idemctl({"key", "derive", "billing", "user:alice", "invoice-9", "pay", "v1"});
  const CliRun d3 = Idemctl({"key", "derive", "billing", "user:alice", "invoice-9", "pay", "v2"});
  EXPECT_EQ(d1.code, 0);
  EXPECT_EQ(d1.out, d2.out);
  EXPECT_NE(d1.out, d3.out);

  const CliRun help = Idemctl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("idemctl send"), std::string::npos);
  // Every way idemctl can end is in the help: a signal too.
  EXPECT_NE(help.out.find("143 (SIGTERM) or 130 (SIGINT)"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("over 64 MiB"), std::string::npos) << help.out;
  EXPECT_EQ(Idemctl({"send"}).code, 2);
  EXPECT_EQ(Idemctl({"send", "--attempts", "0", "http://127.0.0.1:1/"}).code, 2);
  EXPECT_EQ(Idemctl({"frobnicate"}).code, 2);
  EXPECT_EQ(Idemctl({"dlq", "show", "nope"}).code, 2);
  // An unknown keys command is said as such, not taken for one missing its key.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"keys"}, std::vector<std::string>{"keys", "bogus"},
        std::vector<std::string>{"keys", "bogus", "k"}}) {
    const CliRun keys = Idemctl(args);
    EXPECT_EQ(keys.code, 2) << keys.err;
    EXPECT_NE(keys.err.find("keys needs get or purge"), std::string::npos) << keys.err;
    EXPECT_EQ(keys.err.find("stored key"), std::string::npos) << keys.err;
  }
}

}  // namespace
}  // namespace idemgate::testing
