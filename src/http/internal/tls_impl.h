#pragma once

// TlsContext's insides, shared by tls.cc, upstream_pool.cc and server.cc.
// Internal to src/http: include only from .cc files of src/http.

#include <boost/asio/ssl/context.hpp>

#include "http/tls.h"

namespace idemgate::http {

struct TlsContext::Impl {
  explicit Impl(boost::asio::ssl::context::method method) : context(method) {}
  boost::asio::ssl::context context;
};

}  // namespace idemgate::http
