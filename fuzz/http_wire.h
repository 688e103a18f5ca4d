#pragma once

// The peer's side of a connection for the HTTP fuzz targets: hands the input
// to the parser in pieces of fuzz-chosen sizes, as successive receives would,
// so that a target can compare a whole feed with a cut-up one.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "http/internal/io.h"

namespace idemgate::fuzz {

class Wire {
 public:
  // `sizes` (n_sizes of them, cycled) are the piece sizes; none: all at once.
  Wire(std::string_view input, const std::uint8_t* sizes, std::size_t n_sizes)
      : input_(input), sizes_(sizes), n_sizes_(n_sizes) {}

  // Places the next piece (at most `max` bytes) in buffer.prepare(); eof once
  // everything was sent. The caller commits, as after async_read_some.
  std::size_t Receive(http::internal::beast::flat_buffer& buffer, std::size_t max,
                      http::internal::error_code& ec) {
    ec = {};
    if (at_ == input_.size()) {
      ec = http::internal::asio::error::eof;
      return 0;
    }
    std::size_t piece = input_.size() - at_;
    if (n_sizes_ > 0) piece = std::max<std::size_t>(1, sizes_[next_++ % n_sizes_]);
    piece = std::min({piece, max, input_.size() - at_});
    const auto room = buffer.prepare(piece);
    std::memcpy(room.data(), input_.data() + at_, piece);
    at_ += piece;
    return piece;
  }
  std::size_t unsent() const { return input_.size() - at_; }

 private:
  std::string_view input_;
  const std::uint8_t* sizes_;
  std::size_t n_sizes_;
  std::size_t at_ = 0;
  std::size_t next_ = 0;
};

}  // namespace idemgate::fuzz
