// Upstream responses as the proxy reads them (proxy.cc, ExchangeImpl::Forward),
// without sockets: a fresh Beast response parser per head, interim 1xx
// heads skipped, 101 refused, then the body relayed through ParseBody in
// small blocks, with OnReceive completing a body that ends with the
// connection. The first byte picks the header limit, whether the request
// was HEAD, and how the bytes arrive (whole reads, or reads cut at
// fuzz-chosen sizes); the rest is what the upstream sends. Checked:
// - whole or cut into pieces, the proxy sees the same heads, body and
//   outcome, and leaves the same bytes unread;
// - limits: the status line and header block together stay within the
//   limit, and no wait for more bytes happens with more than the limit
//   unparsed (header block, chunk-size lines, trailers);
// - framing: never both chunked and Content-Length; a Content-Length body
//   has exactly that length; a HEAD, 204 or 304 response has no body;
//   trailer fields are dropped, leaving the header fields as they were.

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_target.h"
#include "http_wire.h"
#include "http/internal/exchange_impl.h"
#include "http/internal/io.h"

namespace internal = idemgate::http::internal;
namespace asio = internal::asio;
namespace beast = internal::beast;
namespace bhttp = internal::bhttp;
using internal::error_code;

namespace {

using idemgate::fuzz::Wire;

using Fields = std::vector<std::pair<std::string, std::string>>;

Fields FieldsOf(const internal::ResponseParser& parser) {
  Fields out;
  for (const auto& f : parser.get()) out.emplace_back(std::string(f.name_string()), std::string(f.value()));
  return out;
}

class Exchange {
 public:
  Exchange(Wire& wire, std::size_t header_limit, bool head_request)
      : wire_(wire), header_limit_(header_limit), head_request_(head_request) {}

  std::string Run() {
    if (!ReadHead()) return log_;
    ReadBody();
    return log_;
  }

 private:
  void Log(const std::string& line) {
    log_ += line;
    log_ += '\n';
  }

  bool Receive(internal::Pump& pump, std::size_t max) {
    error_code ec;
    const std::size_t n = wire_.Receive(buffer_, max, ec);
    received_ += n;
    return internal::OnReceive(*parser_, buffer_, ec, n, pump);
  }

  // The final response head, after any interim ones.
  bool ReadHead() {
    for (int heads = 0;; ++heads) {
      parser_.reset();
      parser_.emplace();
      parser_->header_limit(static_cast<std::uint32_t>(header_limit_));
      parser_->body_limit(boost::none);
      if (head_request_) parser_->skip(true);
      const std::size_t start = received_ - buffer_.size();
      internal::Pump pump;
      for (;;) {
        internal::ParseHeader(*parser_, buffer_, header_limit_, pump);
        if (!pump.need_more) break;
        FUZZ_CHECK(buffer_.size() <= header_limit_);
        if (!Receive(pump, internal::kHeaderReadSize)) break;
      }
      if (pump.ec) {
        // Which error depends on the pieces (see http_request_fuzz.cc).
        Log("head error");
        return false;
      }
      FUZZ_CHECK(parser_->is_header_done());
      FUZZ_CHECK(received_ - buffer_.size() - start <= header_limit_);
      const auto& res = parser_->get();
      const unsigned status = res.result_int();
      FUZZ_CHECK(!(parser_->chunked() && parser_->content_length()));
      for (const auto& [name, value] : FieldsOf(*parser_)) {
        FUZZ_CHECK(value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos);
      }
      std::string head = "head " + std::to_string(status) + " " + std::string(res.reason()) + " " +
                         std::to_string(res.version()) + (parser_->chunked() ? " chunked" : "") +
                         (parser_->content_length() ? " length=" + std::to_string(*parser_->content_length()) : "") +
                         (parser_->need_eof() ? " to-eof" : "") + (parser_->keep_alive() ? " keep-alive" : "");
      fields_ = FieldsOf(*parser_);
      for (const auto& [name, value] : fields_) head += "\n  " + name + ": " + value;
      Log(head);
      if (status == 101) {
        Log("upgrade refused");
        return false;
      }
      if (status >= 100 && status < 200) {
        // An interim head carries no body; the final one follows.
        FUZZ_CHECK(parser_->is_done());
        FUZZ_CHECK(heads < 1000);
        continue;
      }
      return true;
    }
  }

  void ReadBody() {
    const unsigned status = parser_->get().result_int();
    const auto content_length = parser_->content_length();
    std::string body;
    bool failed = false;
    while (!parser_->is_done()) {
      // Small blocks, so that the body of a short input spans several.
      char block[7];
      auto& b = parser_->get().body();
      b.data = block;
      b.size = sizeof block;
      internal::Pump pump;
      for (;;) {
        internal::ParseBody(*parser_, buffer_, sizeof block, false, header_limit_, pump);
        if (!pump.need_more) break;
        FUZZ_CHECK(buffer_.size() <= header_limit_);
        if (!Receive(pump, internal::kBodyReadSize)) break;
      }
      FUZZ_CHECK(pump.bytes <= sizeof block);
      body.append(block, pump.bytes);
      if (pump.ec) {
        Log("body error");
        failed = true;
        break;
      }
      if (!parser_->is_done()) FUZZ_CHECK(pump.bytes > 0);
    }
    // A 204's or 304's Content-Length describes no body of its own.
    const bool bodiless = head_request_ || status == 204 || status == 304;
    if (bodiless) FUZZ_CHECK(body.empty());
    if (!failed && content_length && !bodiless) FUZZ_CHECK(body.size() == *content_length);
    // Trailer fields were dropped, not added to the header fields.
    FUZZ_CHECK(FieldsOf(*parser_) == fields_);
    Log("body " + std::to_string(body.size()) + " " + body);
    if (failed) return;
    Log("unread " + std::to_string(buffer_.size() + wire_.unsent()));
  }

  Wire& wire_;
  std::size_t header_limit_;
  bool head_request_;
  beast::flat_buffer buffer_;
  std::optional<internal::ResponseParser> parser_;
  Fields fields_;
  std::size_t received_ = 0;
  std::string log_;
};

}  // namespace

IDEMGATE_FUZZ_TARGET(http_response) {
  if (size == 0) return 0;
  const std::uint8_t control = data[0];
  static constexpr std::size_t kLimits[] = {internal::kUpstreamHeaderLimit, 64, 300, 1024};
  const std::size_t header_limit = kLimits[control & 0x03];
  const bool head_request = (control & 0x20) != 0;
  // 0..7 receive sizes follow the control byte; the receives cycle through them.
  const std::size_t n_sizes = std::min<std::size_t>((control >> 2) & 0x07, size - 1);
  const std::string_view input = idemgate::fuzz::AsView(data + 1 + n_sizes, size - 1 - n_sizes);

  Wire whole_wire(input, nullptr, 0);
  const std::string whole = Exchange(whole_wire, header_limit, head_request).Run();
  // Without sizes: one byte per receive, the slowest upstream.
  static constexpr std::uint8_t kOne = 1;
  Wire split_wire(input, n_sizes > 0 ? data + 1 : &kOne, n_sizes > 0 ? n_sizes : 1);
  const std::string split = Exchange(split_wire, header_limit, head_request).Run();
  if (whole != split) std::fprintf(stderr, "whole:\n%s\nsplit:\n%s\n", whole.c_str(), split.c_str());
  FUZZ_CHECK(whole == split);
  return 0;
}
