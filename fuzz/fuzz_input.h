#pragma once

// Reading a target's input as a series of choices, and targets whose first
// byte's low bit picks what the rest of the input is.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "fuzz_target.h"

namespace idemgate::fuzz {

// Reads choices from the input; zeros (and empty runs) once it runs out.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  std::uint8_t Byte() {
    if (data_.empty()) return 0;
    const auto b = static_cast<std::uint8_t>(data_.front());
    data_.remove_prefix(1);
    return b;
  }
  // Two bytes, high first. (Named reads in order: the operands of one
  // expression are evaluated in an unspecified order, and GCC's replay and
  // clang's libFuzzer build must read an input the same way.)
  std::uint16_t Word() {
    const unsigned high = Byte();
    const unsigned low = Byte();
    return static_cast<std::uint16_t>(high << 8 | low);
  }
  // A signed 16-bit value from two bytes.
  std::int64_t Offset() { return static_cast<std::int16_t>(Word()); }
  std::uint32_t U32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | Byte();
    return v;
  }
  // The next `n` bytes, fewer where the input ends.
  std::string_view Bytes(std::size_t n) {
    const std::string_view out = data_.substr(0, n);
    data_.remove_prefix(out.size());
    return out;
  }
  std::string_view Rest() { return std::exchange(data_, {}); }
  bool Empty() const { return data_.empty(); }

 private:
  std::string_view data_;
};

// A target's body when the first byte's low bit picks what the rest is: `if_set`
// or `if_clear` gets the rest; an empty input is nothing.
inline int ByLowBit(const std::uint8_t* data, std::size_t size, void (*if_set)(std::string_view),
                    void (*if_clear)(std::string_view)) {
  if (size == 0) return 0;
  const std::string_view rest = AsView(data + 1, size - 1);
  if (data[0] & 1) {
    if_set(rest);
  } else {
    if_clear(rest);
  }
  return 0;
}

}  // namespace idemgate::fuzz
