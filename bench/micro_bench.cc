// Micro-benchmarks of the pure per-request work in src/core: key parsing,
// the scoped key, the fingerprint (canonical JSON and SHA-256), the decision,
// building a replay and the record encoding every store uses.
//
//   micro_bench [--benchmark_filter=REGEX] [--benchmark_min_time=0.2]
//
// The request body is the 200-byte JSON document bench/run.sh sends.

#include <benchmark/benchmark.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/decision.h"
#include "core/fingerprint.h"
#include "core/key.h"
#include "core/record.h"
#include "core/scope.h"

namespace idemgate::core {
namespace {

constexpr std::string_view kBody =
    R"({"amount":1000,"currency":"EUR","customer":"cus_0000000000000001",)"
    R"("description":"idemgate benchmark payload","metadata":{"order":"ord_000042",)"
    R"("channel":"web","note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}})";
static_assert(kBody.size() == 200);

constexpr UnixMillis kNow = 1'700'000'000'000;

// The same body with keys out of order and white space: canonical form work.
constexpr std::string_view kBodyMessy =
    R"({ "metadata": { "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
  "channel": "web", "order": "ord_000042" }, "description": "idemgate benchmark payload",
  "customer": "cus_0000000000000001", "currency": "EUR", "amount": 1000.0 })";

std::string LargeJson() {
  std::string json = "{\"items\":[";
  for (int i = 0; i < 40; ++i) {
    if (i > 0) json += ',';
    json += R"({"sku":"sku-)" + std::to_string(i) +
            R"(","qty":3,"price":12.50,"tags":["a","b","c"],"note":"caf\u00e9 \"quoted\""})";
  }
  json += R"(],"total":1500,"currency":"EUR"})";
  return json;
}

// --------------------------------------------------------------- keys

void BM_ParseKey(benchmark::State& state, std::string_view value) {
  KeyRules rules;
  const std::vector<std::string_view> values = {value};
  for (auto _ : state) {
    ParsedKey parsed = ParseIdempotencyKey(values, rules);
    benchmark::DoNotOptimize(parsed);
  }
}
BENCHMARK_CAPTURE(BM_ParseKey, sf_string, R"("k1700000000-1-123456")");
BENCHMARK_CAPTURE(BM_ParseKey, token, "k1700000000-1-123456");
BENCHMARK_CAPTURE(BM_ParseKey, uuid_sf_string, R"("8e0f8f0e-6c1b-4b8e-9a53-0d4a3f2f7c11")");
BENCHMARK_CAPTURE(BM_ParseKey, escaped_refused_charset, R"("order\\42-\"x\"")");

void BM_ScopedKey(benchmark::State& state) {
  const Caller caller{"acme", "billing", "user:alice"};
  for (auto _ : state) {
    std::string key = ScopedKey(ScopeLevel::kSubject, caller, "payments", "k1700000000-1-123456");
    benchmark::DoNotOptimize(key);
  }
}
BENCHMARK(BM_ScopedKey);

// --------------------------------------------------------------- fingerprint

void BM_CanonicalJson(benchmark::State& state, std::string json) {
  for (auto _ : state) {
    auto canonical = CanonicalJson(json);
    benchmark::DoNotOptimize(canonical);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * json.size()));
}
BENCHMARK_CAPTURE(BM_CanonicalJson, body_200B, std::string(kBody));
BENCHMARK_CAPTURE(BM_CanonicalJson, messy_body, std::string(kBodyMessy));
BENCHMARK_CAPTURE(BM_CanonicalJson, items_4KiB, LargeJson());

FingerprintRequest BenchRequest(std::string_view body) {
  FingerprintRequest request;
  request.method = "POST";
  request.route_id = "payments";
  request.target = "/api/v1/payments?expand=customer";
  request.headers = {{"Host", "127.0.0.1:8080"},
                     {"User-Agent", "bench/1.0"},
                     {"Content-Type", "application/json"},
                     {"Content-Length", "200"},
                     {"Idempotency-Key", R"("k1700000000-1-123456")"},
                     {"Accept", "*/*"}};
  request.body = body;
  return request;
}

void BM_Fingerprint(benchmark::State& state, JsonMode mode, std::vector<std::string> fields) {
  const FingerprintRequest request = BenchRequest(kBody);
  FingerprintRules rules;
  rules.json = mode;
  rules.json_fields = std::move(fields);
  for (auto _ : state) {
    std::string fingerprint = ComputeFingerprint(request, rules);
    benchmark::DoNotOptimize(fingerprint);
  }
}
BENCHMARK_CAPTURE(BM_Fingerprint, canonical_200B, JsonMode::kCanonical, std::vector<std::string>{});
BENCHMARK_CAPTURE(BM_Fingerprint, raw_200B, JsonMode::kRaw, std::vector<std::string>{});
BENCHMARK_CAPTURE(BM_Fingerprint, json_fields_200B, JsonMode::kCanonical,
                  std::vector<std::string>{"/amount", "/currency"});

// --------------------------------------------------------------- decision, replay

Record CompletedRecord(const std::string& fingerprint) {
  Record record;
  record.state = RecordState::kCompleted;
  record.fingerprint = fingerprint;
  record.owner = "0123456789abcdef";
  record.operation_id = "op_0123456789abcdef01234567";
  record.created_ms = kNow - 1000;
  record.expires_ms = kNow + 86'400'000;
  record.response.status = 201;
  record.response.headers = {{"Content-Type", "application/json"},
                             {"Content-Length", "200"},
                             {"Date", "Tue, 14 Nov 2023 22:13:20 GMT"},
                             {"Connection", "keep-alive"},
                             {"X-Request-Id", "0af7651916cd43dd8448eb211c80319c"},
                             {"Set-Cookie", "a=1"},
                             {"Set-Cookie", "b=2"}};
  record.response.body = std::string(kBody);
  return record;
}

void BM_Decide(benchmark::State& state, int which) {
  const std::string fingerprint(32, 'f');
  std::optional<Record> existing;
  if (which == 1) existing = CompletedRecord(fingerprint);
  if (which == 2) existing = CompletedRecord(std::string(32, 'g'));
  if (which == 3) {
    existing = CompletedRecord(fingerprint);
    existing->state = RecordState::kInFlight;
    existing->lease_expires_ms = kNow + 30'000;
  }
  for (auto _ : state) {
    Action action = Decide(existing, fingerprint, kNow, InFlightMode::kReject);
    benchmark::DoNotOptimize(action);
  }
}
BENCHMARK_CAPTURE(BM_Decide, none, 0);
BENCHMARK_CAPTURE(BM_Decide, completed_same, 1);
BENCHMARK_CAPTURE(BM_Decide, completed_other, 2);
BENCHMARK_CAPTURE(BM_Decide, in_flight, 3);

void BM_ClassifyResponse(benchmark::State& state) {
  int status = 200;
  for (auto _ : state) {
    Classification c = ClassifyResponse(status, false, false);
    benchmark::DoNotOptimize(c);
    status = status == 200 ? 503 : 200;
  }
}
BENCHMARK(BM_ClassifyResponse);

void BM_BuildReplay(benchmark::State& state) {
  const Record record = CompletedRecord(std::string(32, 'f'));
  for (auto _ : state) {
    StoredResponse replay = BuildReplay(record, kDefaultReplayHeader, kNow);
    benchmark::DoNotOptimize(replay);
  }
}
BENCHMARK(BM_BuildReplay);

// --------------------------------------------------------------- record encoding

void BM_EncodeRecord(benchmark::State& state) {
  const Record record = CompletedRecord(std::string(32, 'f'));
  for (auto _ : state) {
    std::string bytes = EncodeRecord(record);
    benchmark::DoNotOptimize(bytes);
  }
}
BENCHMARK(BM_EncodeRecord);

void BM_DecodeRecord(benchmark::State& state) {
  const std::string bytes = EncodeRecord(CompletedRecord(std::string(32, 'f')));
  for (auto _ : state) {
    auto record = DecodeRecord(bytes);
    benchmark::DoNotOptimize(record);
  }
}
BENCHMARK(BM_DecodeRecord);

}  // namespace
}  // namespace idemgate::core
