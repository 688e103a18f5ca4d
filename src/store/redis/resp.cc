#include "store/redis/resp.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace idemgate::store::redis {
namespace {

// Decimal digits of `n`.
std::size_t DecimalLength(std::uint64_t n) {
  std::size_t len = 1;
  while (n >= 10) {
    n /= 10;
    ++len;
  }
  return len;
}

// Writes "<type><n>\r\n" (n >= 0, of `len` digits) at `p`; returns the end.
char* PutLength(char* p, char type, std::uint64_t n, std::size_t len) {
  *p++ = type;
  char* end = p + len;
  do {
    *--end = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n != 0);
  p += len;
  *p++ = '\r';
  *p++ = '\n';
  return p;
}

void AppendLength(std::string* out, char type, std::int64_t n) {
  char digits[24];
  auto res = std::to_chars(digits, digits + sizeof digits, n);
  out->push_back(type);
  out->append(digits, res.ptr);
  out->append("\r\n", 2);
}

// Parses a signed decimal that spans the whole of `s`.
bool ParseInt(std::string_view s, std::int64_t* v) {
  if (s.empty()) return false;
  auto res = std::from_chars(s.data(), s.data() + s.size(), *v);
  return res.ec == std::errc() && res.ptr == s.data() + s.size();
}

}  // namespace

bool Reply::IsErrorCode(std::string_view prefix) const {
  if (type != Type::kError || str.size() < prefix.size()) return false;
  if (std::string_view(str).substr(0, prefix.size()) != prefix) return false;
  return str.size() == prefix.size() || str[prefix.size()] == ' ';
}

std::string Reply::DebugString() const {
  switch (type) {
    case Type::kString: return "\"" + str + "\"";
    case Type::kStatus: return str;
    case Type::kError: return "(error) " + str;
    case Type::kInteger: return std::to_string(integer);
    case Type::kNil: return "nil";
    case Type::kArray: {
      std::string s = "[";
      for (std::size_t i = 0; i < elements.size(); ++i) {
        if (i) s += ", ";
        s += elements[i].DebugString();
      }
      return s + "]";
    }
  }
  return "?";
}

// Sized first, then written through one pointer: a command is built for
// every store call, and appending field by field (a length conversion and
// three appends per argument) was about 2k instructions per command.
void AppendCommand(std::string* out, const std::vector<std::string>& args, std::size_t arg,
                   std::size_t* arg_offset) {
  const std::size_t count_len = DecimalLength(args.size());
  std::size_t total = 1 + count_len + 2;
  for (const std::string& a : args) total += 1 + DecimalLength(a.size()) + 2 + a.size() + 2;
  const std::size_t start = out->size();
  out->resize(start + total);
  char* p = out->data() + start;
  p = PutLength(p, '*', args.size(), count_len);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    p = PutLength(p, '$', a.size(), DecimalLength(a.size()));
    if (arg_offset != nullptr && i == arg) *arg_offset = static_cast<std::size_t>(p - out->data());
    if (!a.empty()) std::memcpy(p, a.data(), a.size());
    p += a.size();
    *p++ = '\r';
    *p++ = '\n';
  }
}

std::string EncodeCommand(const std::vector<std::string>& args) {
  std::string out;
  AppendCommand(&out, args);
  return out;
}

void AppendReply(std::string* out, const Reply& reply) {
  switch (reply.type) {
    case Reply::Type::kString:
      AppendLength(out, '$', static_cast<std::int64_t>(reply.str.size()));
      out->append(reply.str);
      out->append("\r\n");
      return;
    case Reply::Type::kStatus:
    case Reply::Type::kError:
      out->push_back(reply.type == Reply::Type::kStatus ? '+' : '-');
      out->append(reply.str);
      out->append("\r\n");
      return;
    case Reply::Type::kInteger:
      AppendLength(out, ':', reply.integer);
      return;
    case Reply::Type::kNil:
      out->append("$-1\r\n");
      return;
    case Reply::Type::kArray:
      AppendLength(out, '*', static_cast<std::int64_t>(reply.elements.size()));
      for (const Reply& e : reply.elements) AppendReply(out, e);
      return;
  }
}

Status StatusFromErrorReply(std::string_view error) {
  std::string message = "redis: " + std::string(error);
  std::string_view code = error.substr(0, error.find(' '));
  if (code == "OOM") return ResourceExhaustedError(std::move(message));
  if (code == "LOADING" || code == "BUSY" || code == "CLUSTERDOWN" || code == "TRYAGAIN" ||
      code == "MASTERDOWN" || code == "READONLY" || code == "NOAUTH" || code == "WRONGPASS" ||
      code == "NOREPLICAS") {
    return UnavailableError(std::move(message));
  }
  return InternalError(std::move(message));
}

void RespParser::Feed(const char* data, std::size_t n) {
  if (!error_.empty()) return;
  Compact();
  buf_.append(data, n);
}

void RespParser::Compact() {
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 4096 && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
}

RespParser::Result RespParser::Fail(std::string message) {
  error_ = "resp: " + std::move(message);
  stack_.clear();
  buf_.clear();
  pos_ = 0;
  line_searched_ = 0;
  return Result::kError;
}

bool RespParser::Deliver(Reply value, Reply* out) {
  while (!stack_.empty()) {
    Frame& top = stack_.back();
    top.array.elements.push_back(std::move(value));
    if (top.array.elements.size() < top.expected) return false;
    value = std::move(top.array);
    stack_.pop_back();
  }
  *out = std::move(value);
  return true;
}

RespParser::Result RespParser::Next(Reply* out) {
  if (!error_.empty()) return Result::kError;
  for (;;) {
    const std::size_t avail = buf_.size() - pos_;
    if (pending_bulk_ >= 0) {
      const auto need = static_cast<std::size_t>(pending_bulk_);
      if (avail < need + 2) return Result::kNeedMore;
      if (buf_[pos_ + need] != '\r' || buf_[pos_ + need + 1] != '\n') {
        return Fail("bulk string not terminated by CRLF");
      }
      Reply r = Reply::String(buf_.substr(pos_, need));
      pos_ += need + 2;
      pending_bulk_ = -1;
      if (Deliver(std::move(r), out)) return Result::kReply;
      continue;
    }

    const char* begin = buf_.data() + pos_;
    // Resume the search where the last one stopped: rescanning an incomplete
    // line from its start on every read would be quadratic in its length.
    const std::size_t from = std::min(line_searched_, avail);
    bytes_searched_ += avail - from;
    const void* cr = std::memchr(begin + from, '\r', avail - from);
    if (cr == nullptr || static_cast<const char*>(cr) + 1 >= begin + avail) {
      // A CR at the very end may start the line's CRLF: it is not part of
      // the line, or a line of exactly max_line bytes would be refused when
      // its CR and LF arrive apart but accepted when they arrive together.
      // The next search starts at that CR.
      line_searched_ = cr == nullptr ? avail : avail - 1;
      if (avail - (cr == nullptr ? 0 : 1) > limits_.max_line) return Fail("line too long");
      return Result::kNeedMore;
    }
    line_searched_ = 0;
    const auto line_len = static_cast<std::size_t>(static_cast<const char*>(cr) - begin);
    if (begin[line_len + 1] != '\n') return Fail("CR not followed by LF");
    if (line_len == 0) return Fail("empty line");
    if (line_len > limits_.max_line) return Fail("line too long");
    const char type = begin[0];
    std::string_view rest(begin + 1, line_len - 1);
    pos_ += line_len + 2;

    Reply r;
    switch (type) {
      case '+':
        r = Reply::StatusReply(std::string(rest));
        break;
      case '-':
        r = Reply::Error(std::string(rest));
        break;
      case ':': {
        std::int64_t v = 0;
        if (!ParseInt(rest, &v)) return Fail("bad integer");
        r = Reply::Integer(v);
        break;
      }
      case '$': {
        std::int64_t n = 0;
        if (!ParseInt(rest, &n) || n < -1) return Fail("bad bulk length");
        if (n == -1) {
          r = Reply::Nil();
          break;
        }
        if (static_cast<std::uint64_t>(n) > limits_.max_bulk) return Fail("bulk string too large");
        pending_bulk_ = n;
        continue;
      }
      case '*': {
        std::int64_t n = 0;
        if (!ParseInt(rest, &n) || n < -1) return Fail("bad array length");
        if (n == -1) {
          r = Reply::Nil();
          break;
        }
        if (static_cast<std::uint64_t>(n) > limits_.max_elements) return Fail("array too large");
        if (n == 0) {
          r = Reply::Array({});
          break;
        }
        if (stack_.size() >= limits_.max_depth) return Fail("arrays nested too deeply");
        Frame f;
        f.array.type = Reply::Type::kArray;
        f.expected = static_cast<std::size_t>(n);
        f.array.elements.reserve(std::min<std::size_t>(f.expected, 1024));
        stack_.push_back(std::move(f));
        continue;
      }
      default:
        return Fail(std::string("unknown type byte 0x") + "0123456789abcdef"[(type >> 4) & 0xf] +
                    "0123456789abcdef"[type & 0xf]);
    }
    if (Deliver(std::move(r), out)) return Result::kReply;
  }
}

}  // namespace idemgate::store::redis
