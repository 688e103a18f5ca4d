// The API keys file (SPEC §6, identity::ParseApiKeys): YAML mapping key
// hashes to callers. The first byte's low bit picks what the rest is:
//  - 0: the file's text. Checked: a refusal names the file (and a line) first; a file
//    that is read maps 64 lower-case hex digits to callers whose tenant,
//    project and subject are 1..256 visible ASCII characters; and the map
//    written back as YAML reads back the same.
//  - 1: choices for a file written here (up to six entries; hashes in any
//    case, some repeated; components of any bytes, double-quoted with
//    escapes or plain; flow or block style; an optional name or an unknown
//    field). Checked: it is read exactly when every entry is valid, to the
//    entries written, and otherwise refused naming a line and the first bad entry.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/scope.h"
#include "fuzz_input.h"
#include "fuzz_reference.h"
#include "fuzz_target.h"
#include "identity/api_keys.h"

namespace {

namespace identity = idemgate::identity;
using idemgate::fuzz::Hex;
using idemgate::fuzz::IsCallerComponent;
using idemgate::fuzz::Reader;
using Keys = std::unordered_map<std::string, idemgate::core::Caller>;

constexpr std::string_view kSource = "keys.yaml";

bool IsLowerHex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A YAML double-quoted scalar of arbitrary bytes, and the string it reads back as: printable
// ASCII as itself, other bytes as \xNN, which YAML reads as U+00NN (so two UTF-8 bytes from 0x80).
std::string Quoted(std::string_view s, std::string* decoded) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out.push_back(c);
      decoded->push_back(c);
      continue;
    }
    out.append("\\x").append(Hex(std::string_view(&c, 1), true));
    if (u < 0x80) {
      decoded->push_back(c);
    } else {
      decoded->push_back(static_cast<char>(0xc0 | (u >> 6)));
      decoded->push_back(static_cast<char>(0x80 | (u & 0x3f)));
    }
  }
  return out + "\"";
}

// The map as a keys file, every value double-quoted. ("keys:" alone would be a null, not a list.)
std::string Write(const Keys& keys) {
  if (keys.empty()) return "keys: []\n";
  std::string out = "keys:\n";
  for (const auto& [sha, caller] : keys) {
    std::string ignored;
    out += "  - { sha256: " + sha + ", tenant: " + Quoted(caller.tenant, &ignored) +
           ", project: " + Quoted(caller.project, &ignored) +
           ", subject: " + Quoted(caller.subject, &ignored) + " }\n";
  }
  return out;
}

// What a refusal says after "keys.yaml:<line>: " (or "keys.yaml: " when no line is known), with
// the line in *line (0 when none); "" when it does not start so.
std::string_view AfterLocation(std::string_view message, int* line) {
  *line = 0;
  if (!message.starts_with(std::string(kSource) + ":")) return {};
  message.remove_prefix(kSource.size() + 1);
  if (!message.empty() && message[0] >= '1' && message[0] <= '9') {
    while (!message.empty() && message[0] >= '0' && message[0] <= '9' && *line < 100000000) {
      *line = *line * 10 + (message[0] - '0');
      message.remove_prefix(1);
    }
    if (!message.starts_with(":")) return {};
    message.remove_prefix(1);
  }
  if (!message.starts_with(" ")) return {};
  return message.substr(1);
}

void CheckText(std::string_view text) {
  const auto keys = identity::ParseApiKeys(text, std::string(kSource));
  if (!keys.ok()) {
    int line = 0;
    FUZZ_CHECK(!AfterLocation(keys.status().message(), &line).empty());
    return;
  }
  for (const auto& [sha, caller] : *keys) {
    FUZZ_CHECK(IsLowerHex64(sha));
    FUZZ_CHECK(IsCallerComponent(caller.tenant) && IsCallerComponent(caller.project) &&
               IsCallerComponent(caller.subject));
  }
  const auto again = identity::ParseApiKeys(Write(*keys), std::string(kSource));
  FUZZ_CHECK(again.ok() && again->size() == keys->size());
  for (const auto& [sha, caller] : *keys) {
    const auto found = again->find(sha);
    FUZZ_CHECK(found != again->end());
    FUZZ_CHECK(found->second.tenant == caller.tenant && found->second.project == caller.project &&
               found->second.subject == caller.subject);
  }
}

// A component from the input, and its spelling: plain when it is letters and digits only
// (and not a word YAML reads as null), else double-quoted.
std::string Component(Reader& in, std::string* decoded) {
  const std::string_view raw = in.Bytes(in.Byte() % 12);
  bool plain = !raw.empty() && raw != "null" && raw != "Null" && raw != "NULL";
  for (const char c : raw) {
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'));
  }
  if (plain) {
    decoded->assign(raw);
    return std::string(raw);
  }
  return Quoted(raw, decoded);
}

void CheckWritten(std::string_view data) {
  Reader in(data);
  const bool block = in.Byte() & 1;
  std::string text = "keys:\n";
  Keys expected;
  int first_bad = -1;
  for (int i = 0; i < 6 && !in.Empty(); ++i) {
    const std::uint8_t flags = in.Byte();
    // One of four hashes, so that some repeat, each in either case.
    std::string sha(64, '0');
    for (std::size_t j = 0; j < sha.size(); ++j) {
      sha[j] = "0123456789abcdef"[(j * 7 + (flags & 3) * 5) % 16];
      if ((flags & 4) && sha[j] >= 'a') sha[j] = static_cast<char>(sha[j] - 32);
    }
    std::string lower = sha;
    for (char& c : lower) c = c >= 'A' && c <= 'F' ? static_cast<char>(c + 32) : c;
    idemgate::core::Caller caller;
    std::string fields[3];
    fields[0] = Component(in, &caller.tenant);
    fields[1] = Component(in, &caller.project);
    fields[2] = Component(in, &caller.subject);
    const bool unknown = (flags & 0x18) == 0x18;
    const bool bad_hash = (flags & 0x60) == 0x60;
    if (bad_hash) sha.pop_back();

    std::string entry[5] = {"sha256: " + sha, "tenant: " + fields[0], "project: " + fields[1],
                            "subject: " + fields[2], unknown ? "role: admin" : "name: \"entry\""};
    if (block) {
      text += "  - " + entry[0] + "\n";
      for (const std::string& e : {entry[1], entry[2], entry[3], entry[4]})
        text += "    " + e + "\n";
    } else {
      text += "  - { " + entry[0] + ", " + entry[1] + ", " + entry[2] + ", " + entry[3] + ", " +
              entry[4] + " }\n";
    }

    const bool valid = !unknown && !bad_hash && IsCallerComponent(caller.tenant) &&
                       IsCallerComponent(caller.project) && IsCallerComponent(caller.subject) &&
                       !expected.contains(lower);
    if (!valid && first_bad < 0) first_bad = i;
    if (valid) expected.emplace(lower, caller);
  }

  if (text == "keys:\n") text = "keys: []\n";  // no entry: an empty list, not a null
  const auto keys = identity::ParseApiKeys(text, std::string(kSource));
  FUZZ_CHECK(keys.ok() == (first_bad < 0));
  if (!keys.ok()) {
    // Entry i starts on line i + 2 ("keys:" first) in flow style, and takes five lines in block
    // style: the line named is one of the first bad entry's.
    int line = 0;
    FUZZ_CHECK(AfterLocation(keys.status().message(), &line)
                   .starts_with("keys[" + std::to_string(first_bad) + "]"));
    const int first_line = block ? 2 + 5 * first_bad : 2 + first_bad;
    FUZZ_CHECK(line >= first_line && line < first_line + (block ? 5 : 1));
    return;
  }
  FUZZ_CHECK(keys->size() == expected.size());
  for (const auto& [sha, caller] : expected) {
    const auto found = keys->find(sha);
    FUZZ_CHECK(found != keys->end());
    FUZZ_CHECK(found->second.tenant == caller.tenant && found->second.project == caller.project &&
               found->second.subject == caller.subject);
  }
  CheckText(text);
}

}  // namespace

IDEMGATE_FUZZ_TARGET(api_keys) {
  return idemgate::fuzz::ByLowBit(data, size, CheckWritten, CheckText);
}
