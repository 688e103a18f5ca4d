#include "http/message.h"

#include "http/headers.h"

namespace idemgate::http {

std::optional<std::string_view> RequestHead::Find(std::string_view name) const {
  for (const HeaderView& h : headers) {
    if (NameEquals(h.name, name)) return h.value;
  }
  return std::nullopt;
}

std::size_t RequestHead::Count(std::string_view name) const {
  std::size_t n = 0;
  for (const HeaderView& h : headers) {
    if (NameEquals(h.name, name)) ++n;
  }
  return n;
}

}  // namespace idemgate::http
