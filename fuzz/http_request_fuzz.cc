// The gateway's HTTP/1.1 request parsing, driven the way ClientConnection
// and ExchangeImpl drive it (server.cc) but without sockets: RequestParser
// (Beast's parser minus trailer fields) through ParseHeader, ParseBody and
// OnReceive (http/internal/io.h), over a connection of up to four pipelined
// requests whose bodies are read into memory as ReadBody does. The first byte
// picks the header and body limits and how the bytes arrive (whole reads, or
// reads cut at fuzz-chosen sizes); the rest is what the client sends.
// Checked:
// - whole or cut into pieces, the connection sees the same requests (heads,
//   bodies, errors) and leaves the same bytes unread;
// - limits: no wait for more bytes while more than the header limit sits
//   unparsed (header block, chunk-size lines, trailers); a body never
//   exceeds its limit, a Content-Length body has exactly that length;
// - trailer fields never join the header fields; a request is never both
//   chunked and Content-Length framed; field values hold no CR, LF or NUL;
// - the header helpers on what was parsed: SplitList elements are trimmed,
//   non-empty and comma-free; HopByHopFilter drops every Connection token in
//   any case; SplitTarget's parts are consistent with the target.

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_target.h"
#include "http_wire.h"
#include "http/headers.h"
#include "http/internal/exchange_impl.h"
#include "http/internal/io.h"

namespace http = idemgate::http;
namespace internal = idemgate::http::internal;
namespace asio = internal::asio;
namespace beast = internal::beast;
namespace bhttp = internal::bhttp;
using internal::error_code;

namespace {

struct Limits {
  std::uint32_t max_header_bytes;
  std::uint64_t max_body_bytes;
};

using idemgate::fuzz::Wire;

std::string Describe(const error_code& ec) { return std::string(ec.category().name()) + ":" + ec.message(); }

using Fields = std::vector<std::pair<std::string, std::string>>;

Fields FieldsOf(const internal::RequestParser& parser) {
  Fields out;
  for (const auto& f : parser.get()) {
    out.emplace_back(std::string(f.name_string()), std::string(f.value()));
  }
  return out;
}

void CheckHeaderHelpers(const Fields& fields, std::string_view target) {
  http::HopByHopFilter filter;
  std::vector<std::string_view> connection_tokens;
  for (const auto& [name, value] : fields) {
    FUZZ_CHECK(!name.empty());
    FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos);
    for (const std::string_view item : http::SplitList(value)) {
      FUZZ_CHECK(!item.empty() && item.find(',') == std::string_view::npos);
      FUZZ_CHECK(item.front() != ' ' && item.front() != '\t' && item.back() != ' ' && item.back() != '\t');
    }
    if (http::NameEquals(name, "connection")) {
      filter.AddConnectionValue(value);
      const auto items = http::SplitList(value);
      connection_tokens.insert(connection_tokens.end(), items.begin(), items.end());
    }
  }
  FUZZ_CHECK(filter.tokens() == connection_tokens);
  for (const std::string_view token : connection_tokens) {
    std::string upper(token);
    for (char& c : upper) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
    FUZZ_CHECK(filter.ShouldDrop(token) && filter.ShouldDrop(upper));
  }
  FUZZ_CHECK(filter.ShouldDrop("Transfer-Encoding") && filter.ShouldDrop("connection"));
  FUZZ_CHECK(!filter.ShouldDrop("Content-Length") || !connection_tokens.empty());

  const auto parts = http::SplitTarget(target);
  if (!parts) return;
  // An absolute-form target's path may be empty before its query ("http://h?q").
  FUZZ_CHECK(parts->path_and_query.starts_with('/') ||
             (parts->path.empty() && parts->path_and_query.starts_with('?') && !parts->authority.empty()));
  FUZZ_CHECK(parts->path_and_query.find('#') == std::string_view::npos);
  FUZZ_CHECK(parts->path_and_query.starts_with(parts->path));
  FUZZ_CHECK(parts->path.find('?') == std::string_view::npos);
  if (parts->path_and_query.size() > parts->path.size()) {
    FUZZ_CHECK(parts->path_and_query.substr(parts->path.size()) == "?" + std::string(parts->query));
  } else {
    FUZZ_CHECK(parts->query.empty());
  }
  if (target.starts_with('/')) {
    FUZZ_CHECK(parts->authority.empty() && parts->path_and_query == target);
  } else {
    FUZZ_CHECK(!parts->authority.empty());
    FUZZ_CHECK(parts->authority.find_first_of("/?") == std::string_view::npos);
  }
}

class Connection {
 public:
  Connection(Wire& wire, const Limits& limits) : wire_(wire), limits_(limits) {}

  // Serves up to four requests; returns what the handler and the client
  // would see, one line per event.
  std::string Run() {
    for (int request = 0; request < 4; ++request) {
      if (buffer_.size() == 0) {
        error_code ec;
        const std::size_t n = wire_.Receive(buffer_, internal::kHeaderReadSize, ec);
        received_ += n;
        buffer_.commit(n);
        if (ec) {
          Log("closed " + Describe(ec));
          break;
        }
      }
      bool failed = false;
      const bool go_on = ServeOne(failed);
      // After a failure the connection closes; how much had been received
      // by then depends on the pieces.
      if (!failed) Log("unread " + std::to_string(buffer_.size() + wire_.unsent()));
      if (!go_on) break;
    }
    return log_;
  }

 private:
  void Log(const std::string& line) {
    log_ += line;
    log_ += '\n';
  }

  // The bytes of the header block may not wait unparsed beyond the limit.
  void Receive(internal::Pump& pump, std::size_t max, bool& go_on) {
    error_code ec;
    const std::size_t n = wire_.Receive(buffer_, max, ec);
    received_ += n;
    go_on = internal::OnReceive(*parser_, buffer_, ec, n, pump);
  }

  // One request: its head, then its body. False when the connection ends;
  // `failed` when it ends on an error.
  bool ServeOne(bool& failed) {
    parser_.emplace();
    parser_->header_limit(limits_.max_header_bytes);
    parser_->body_limit(boost::none);
    const std::size_t start = received_ - buffer_.size();
    internal::Pump pump;
    for (;;) {
      internal::ParseHeader(*parser_, buffer_, limits_.max_header_bytes, pump);
      if (!pump.need_more) break;
      FUZZ_CHECK(buffer_.size() <= limits_.max_header_bytes);
      bool go_on = false;
      Receive(pump, internal::kHeaderReadSize, go_on);
      if (!go_on) break;
    }
    if (pump.ec) {
      // Which error depends on the pieces: once Beast has waited for more of
      // a start line or header block it looks at nothing until the blank
      // line arrives, so a malformed line seen at once in a whole read can
      // end as a partial message when the bytes trickle in.
      Log("header error");
      failed = true;
      return false;
    }
    FUZZ_CHECK(parser_->is_header_done());
    // The request line and header block together are within the limit.
    FUZZ_CHECK(received_ - buffer_.size() - start <= limits_.max_header_bytes);

    const auto& msg = parser_->get();
    const Fields fields = FieldsOf(*parser_);
    const std::string target(msg.target());
    const bool chunked = parser_->chunked();
    const auto content_length = parser_->content_length();
    // Both framings at once is the classic smuggling ambiguity: refused.
    FUZZ_CHECK(!(chunked && content_length));
    CheckHeaderHelpers(fields, target);
    std::string head = "head " + std::string(msg.method_string()) + " " + target + " " +
                       std::to_string(msg.version()) + (chunked ? " chunked" : "") +
                       (content_length ? " length=" + std::to_string(*content_length) : "") +
                       (parser_->keep_alive() ? " keep-alive" : "");
    for (const auto& [name, value] : fields) head += "\n  " + name + ": " + value;
    Log(head);

    const bool ok = ReadBody(chunked, content_length);
    // Trailer fields were dropped, not appended to the header fields.
    FUZZ_CHECK(FieldsOf(*parser_) == fields);
    failed = !ok;
    return ok && parser_->keep_alive();
  }

  // As ExchangeImpl::ReadBodyPiece: false on failure (logged).
  bool ReadPiece(char* data, std::size_t capacity, bool fill, std::size_t& bytes) {
    auto& body = parser_->get().body();
    body.data = data;
    body.size = capacity;
    internal::Pump pump;
    for (;;) {
      internal::ParseBody(*parser_, buffer_, capacity, fill, limits_.max_header_bytes, pump);
      if (!pump.need_more) break;
      // A chunk-size line or trailer section longer than the header limit
      // fails instead of waiting for more.
      FUZZ_CHECK(buffer_.size() <= limits_.max_header_bytes);
      bool go_on = false;
      Receive(pump, internal::kBodyReadSize, go_on);
      if (!go_on) break;
    }
    bytes = pump.bytes;
    FUZZ_CHECK(bytes <= capacity);
    if (pump.ec) {
      Log("body error " + Describe(pump.ec) + " status " +
          std::to_string(static_cast<int>(internal::BodyStatusFor(pump.ec, false))));
      return false;
    }
    return true;
  }

  // As ExchangeImpl::ReadBody with the route's limit.
  bool ReadBody(bool chunked, const boost::optional<std::uint64_t>& content_length) {
    if (!chunked && (!content_length || *content_length == 0)) {
      FUZZ_CHECK(parser_->is_done());
      return true;
    }
    if (content_length && *content_length > limits_.max_body_bytes) {
      Log("body too large (Content-Length)");
      return false;
    }
    parser_->LimitBody(limits_.max_body_bytes, limits_.max_header_bytes);
    std::string body;
    bool ok = true;
    if (content_length) {
      body.resize(static_cast<std::size_t>(*content_length));
      std::size_t bytes = 0;
      ok = ReadPiece(body.data(), body.size(), true, bytes);
      body.resize(bytes);
      if (ok) FUZZ_CHECK(parser_->is_done() && body.size() == *content_length);
    } else {
      while (ok && !parser_->is_done()) {
        const std::size_t old = body.size();
        // Smaller than the server's block, so that bodies of a short input
        // span several pieces.
        constexpr std::size_t kRoom = 7;
        body.resize(old + kRoom);
        std::size_t bytes = 0;
        ok = ReadPiece(body.data() + old, kRoom, false, bytes);
        body.resize(old + bytes);
        // A piece that is not the last has at least one byte.
        if (ok && !parser_->is_done()) FUZZ_CHECK(bytes > 0);
      }
    }
    FUZZ_CHECK(body.size() <= limits_.max_body_bytes);
    Log("body " + std::to_string(body.size()) + " " + body);
    return ok;
  }

  Wire& wire_;
  Limits limits_;
  beast::flat_buffer buffer_;
  std::optional<internal::RequestParser> parser_;
  std::size_t received_ = 0;  // bytes committed to buffer_
  std::string log_;
};

Limits LimitsFor(unsigned variant) {
  switch (variant) {
    case 1: return {64, 16};
    case 2: return {200, 0};
    case 3: return {1024, 100};
    default: return {16 * 1024, 64 * 1024};  // the default header limit
  }
}

}  // namespace

IDEMGATE_FUZZ_TARGET(http_request) {
  if (size == 0) return 0;
  const std::uint8_t control = data[0];
  const Limits limits = LimitsFor(control & 0x03);
  // 0..7 receive sizes follow the control byte; the receives cycle through them.
  const std::size_t n_sizes = std::min<std::size_t>((control >> 2) & 0x07, size - 1);
  const std::string_view input = idemgate::fuzz::AsView(data + 1 + n_sizes, size - 1 - n_sizes);

  Wire whole_wire(input, nullptr, 0);
  const std::string whole = Connection(whole_wire, limits).Run();

  // Without sizes: one byte per receive, the slowest client.
  static constexpr std::uint8_t kOne = 1;
  Wire split_wire(input, n_sizes > 0 ? data + 1 : &kOne, n_sizes > 0 ? n_sizes : 1);
  const std::string split = Connection(split_wire, limits).Run();
  if (whole != split) {
    std::fprintf(stderr, "whole:\n%s\nsplit:\n%s\n", whole.c_str(), split.c_str());
  }
  FUZZ_CHECK(whole == split);
  return 0;
}
