// fuzz_replay: runs a fuzz target over its committed corpus, then over a
// fixed-seed set of mutations of that corpus, so that every test run (and
// the ASan+UBSan preset in particular) exercises the parsers on hostile input
// without clang or libFuzzer. `make fuzz` does the open-ended search.
//
//   fuzz_replay --list
//   fuzz_replay TARGET DIR [--mutations N] [--seed S]

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_target.h"

namespace idemgate::fuzz {
namespace {

std::map<std::string, TargetFn>& Targets() {
  static std::map<std::string, TargetFn> targets;
  return targets;
}

using Bytes = std::vector<std::uint8_t>;

constexpr std::size_t kMaxInput = 64 * 1024;

// Bytes that sit on the boundaries of the formats fuzzed here: quoting and
// escaping, list and parameter separators, JSON structure, line ends,
// percent escapes, base64 padding, and the ends of the byte range.
constexpr std::array<std::uint8_t, 26> kInteresting = {
    0x00, 0xff, 0x7f, 0x80, '"', '\\', ',', ';', '=', ':', '{', '}', '[',
    ']',  '\r', '\n', ' ', '\t', '%', '/', '.', '0', '9', '-', '+', 'e'};

void Mutate(Bytes& input, const std::vector<Bytes>& corpus, std::mt19937_64& rng) {
  auto pick = [&](std::size_t bound) {
    return bound == 0 ? std::size_t{0}
                      : std::uniform_int_distribution<std::size_t>(0, bound - 1)(rng);
  };
  const int steps = 1 + static_cast<int>(pick(4));
  for (int step = 0; step < steps; ++step) {
    switch (pick(8)) {
      case 0:  // flip one bit
        if (!input.empty()) input[pick(input.size())] ^= static_cast<std::uint8_t>(1u << pick(8));
        break;
      case 1:  // overwrite a byte with a boundary byte
        if (!input.empty()) input[pick(input.size())] = kInteresting[pick(kInteresting.size())];
        break;
      case 2:  // insert a boundary byte
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(pick(input.size() + 1)),
                     kInteresting[pick(kInteresting.size())]);
        break;
      case 3: {  // delete a run
        if (input.empty()) break;
        const std::size_t at = pick(input.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(16, input.size() - at));
        input.erase(input.begin() + static_cast<std::ptrdiff_t>(at),
                    input.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 4: {  // repeat a run (nesting, long values)
        if (input.empty()) break;
        const std::size_t at = pick(input.size());
        const std::size_t n = 1 + pick(std::min<std::size_t>(32, input.size() - at));
        const Bytes run(input.begin() + static_cast<std::ptrdiff_t>(at),
                        input.begin() + static_cast<std::ptrdiff_t>(at + n));
        const std::size_t times = 1 + pick(64);
        for (std::size_t i = 0; i < times && input.size() + run.size() <= kMaxInput; ++i) {
          input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), run.begin(), run.end());
        }
        break;
      }
      case 5:  // truncate
        input.resize(pick(input.size() + 1));
        break;
      case 6: {  // splice in a piece of another corpus entry
        const Bytes& other = corpus[pick(corpus.size())];
        if (other.empty()) break;
        const std::size_t from = pick(other.size());
        const std::size_t n = 1 + pick(other.size() - from);
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(pick(input.size() + 1)),
                     other.begin() + static_cast<std::ptrdiff_t>(from),
                     other.begin() + static_cast<std::ptrdiff_t>(from + n));
        break;
      }
      default:  // a random byte anywhere
        if (!input.empty()) input[pick(input.size())] = static_cast<std::uint8_t>(pick(256));
        break;
    }
    if (input.size() > kMaxInput) input.resize(kMaxInput);
  }
}

bool ReadFile(const std::filesystem::path& path, Bytes& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

int Usage() {
  std::fprintf(stderr,
               "usage: fuzz_replay --list\n"
               "       fuzz_replay TARGET DIR [--mutations N] [--seed S]\n"
               "Runs TARGET over every file in DIR, then over N mutations of them\n"
               "(default 2000, from seed S, default 1). Exits 1 on a missing or empty\n"
               "corpus; a finding aborts the process.\n");
  return 2;
}

bool ParseCount(std::string_view text, std::uint64_t& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

int Main(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--list") {
    for (const auto& [name, fn] : Targets()) std::printf("%s\n", name.c_str());
    return 0;
  }
  if (args.size() < 2) return Usage();
  std::uint64_t mutations = 2000;
  std::uint64_t seed = 1;
  for (std::size_t i = 2; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--mutations" && has_value && ParseCount(args[i + 1], mutations)) {
      ++i;
    } else if (args[i] == "--seed" && has_value && ParseCount(args[i + 1], seed)) {
      ++i;
    } else {
      return Usage();
    }
  }
  const auto found = Targets().find(std::string(args[0]));
  if (found == Targets().end()) {
    std::fprintf(stderr, "fuzz_replay: no target '%.*s' (see --list)\n",
                 static_cast<int>(args[0].size()), args[0].data());
    return 2;
  }
  const TargetFn target = found->second;

  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(args[1]), ec)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  if (ec || files.empty()) {
    std::fprintf(stderr, "fuzz_replay: no corpus files in %.*s\n",
                 static_cast<int>(args[1].size()), args[1].data());
    return 1;
  }
  std::sort(files.begin(), files.end());  // the same order, so the same mutations, every run

  std::vector<Bytes> corpus;
  for (const auto& file : files) {
    Bytes bytes;
    if (!ReadFile(file, bytes)) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", file.c_str());
      return 1;
    }
    target(bytes.data(), bytes.size());
    corpus.push_back(std::move(bytes));
  }

  std::mt19937_64 rng(seed);
  Bytes input;
  for (std::uint64_t i = 0; i < mutations; ++i) {
    input = corpus[i % corpus.size()];
    Mutate(input, corpus, rng);
    target(input.data(), input.size());
  }
  std::printf("fuzz_replay %s: %zu corpus inputs, %llu mutations, no finding\n",
              found->first.c_str(), corpus.size(), static_cast<unsigned long long>(mutations));
  return 0;
}

}  // namespace
}  // namespace idemgate::fuzz

bool idemgate::fuzz::Register(const char* name, TargetFn fn) {
  Targets().emplace(name, fn);
  return true;
}

int main(int argc, char** argv) { return idemgate::fuzz::Main(argc, argv); }
