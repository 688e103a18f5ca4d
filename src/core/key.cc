#include "core/key.h"

namespace idemgate::core {

namespace {

bool IsOws(char c) { return c == ' ' || c == '\t'; }

std::string_view TrimOws(std::string_view s) {
  while (!s.empty() && IsOws(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsOws(s.back())) s.remove_suffix(1);
  return s;
}

bool IsBaseKeyChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '~' || c == '-';
}

// Classifies what follows a complete sf-string inside the field value.
KeyError ClassifyTrailer(std::string_view rest) {
  rest = TrimOws(rest);
  if (rest.empty()) return KeyError::kNone;
  if (rest.front() == ';') return KeyError::kParameters;
  if (rest.front() == ',') return KeyError::kList;
  return KeyError::kBadString;
}

}  // namespace

std::string_view KeyErrorReason(KeyError error) {
  switch (error) {
    case KeyError::kNone: return "";
    case KeyError::kMissing: return "missing";
    case KeyError::kDuplicate: return "duplicate";
    case KeyError::kList: return "list";
    case KeyError::kParameters: return "parameters";
    case KeyError::kEmpty: return "empty";
    case KeyError::kBadString: return "bad_string";
    case KeyError::kBadCharset: return "charset";
    case KeyError::kTooLong: return "too_long";
    case KeyError::kReservedPrefix: return "reserved_prefix";
    case KeyError::kColon: return "colon";
  }
  return "unknown";
}

KeyError ValidateRawKey(std::string_view raw, const KeyRules& rules) {
  if (raw.empty()) return KeyError::kEmpty;
  if (raw.size() > rules.max_length) return KeyError::kTooLong;
  if (raw.find(':') != std::string_view::npos) return KeyError::kColon;
  for (char c : raw) {
    if (!IsBaseKeyChar(c) && rules.extra_charset.find(c) == std::string::npos) {
      return KeyError::kBadCharset;
    }
  }
  if (raw.starts_with(kReservedKeyPrefix)) return KeyError::kReservedPrefix;
  return KeyError::kNone;
}

ParsedKey ParseIdempotencyKey(const std::vector<std::string_view>& values, const KeyRules& rules) {
  ParsedKey out;
  if (values.empty()) {
    out.error = KeyError::kMissing;
    return out;
  }
  if (values.size() > 1) {
    out.error = KeyError::kDuplicate;
    return out;
  }
  const std::string_view value = TrimOws(values.front());
  if (value.empty()) {
    out.error = KeyError::kEmpty;
    return out;
  }

  std::string raw;
  if (value.front() == '"') {
    out.sf_string = true;
    std::size_t i = 1;
    bool closed = false;
    // Runs of plain characters are copied whole (one append per run, not a
    // push_back per character); only an escape interrupts a run.
    std::size_t run = i;
    for (; i < value.size(); ++i) {
      const char c = value[i];
      if (c == '"') {
        raw.append(value.data() + run, i - run);
        closed = true;
        ++i;
        break;
      }
      if (c == '\\') {
        if (i + 1 >= value.size() || (value[i + 1] != '"' && value[i + 1] != '\\')) {
          out.error = KeyError::kBadString;
          return out;
        }
        raw.append(value.data() + run, i - run);
        raw.push_back(value[++i]);
        run = i + 1;
        continue;
      }
      // RFC 8941: an sf-string holds printable ASCII and space only.
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
        out.error = KeyError::kBadString;
        return out;
      }
    }
    if (!closed) {
      out.error = KeyError::kBadString;
      return out;
    }
    if (KeyError trailer = ClassifyTrailer(value.substr(i)); trailer != KeyError::kNone) {
      out.error = trailer;
      return out;
    }
  } else {
    // A bare value: everything up to a list or parameter delimiter.
    const std::size_t delim = value.find_first_of(",;");
    if (delim != std::string_view::npos) {
      out.error = value[delim] == ',' ? KeyError::kList : KeyError::kParameters;
      return out;
    }
    raw.assign(value);
  }

  out.error = ValidateRawKey(raw, rules);
  if (out.ok()) out.key = std::move(raw);
  return out;
}

std::string SerializeKeyAsSfString(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() + 2);
  out.push_back('"');
  // Runs between the characters that need a backslash are copied whole.
  std::size_t run = 0;
  for (std::size_t i = raw.find_first_of("\"\\"); i != std::string_view::npos;
       i = raw.find_first_of("\"\\", i + 1)) {
    out.append(raw.data() + run, i - run);
    out.push_back('\\');
    out.push_back(raw[i]);
    run = i + 1;
  }
  out.append(raw.data() + run, raw.size() - run);
  out.push_back('"');
  return out;
}

}  // namespace idemgate::core
