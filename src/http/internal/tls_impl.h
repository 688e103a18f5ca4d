#pragma once

// UpstreamTls's insides, shared by upstream_tls.cc and upstream_pool.cc.
// Internal to src/http: include only from .cc files of src/http.

#include <boost/asio/ssl/context.hpp>

#include "http/upstream_tls.h"

namespace idemgate::http {

struct UpstreamTls::Impl {
  boost::asio::ssl::context context{boost::asio::ssl::context::tls_client};
};

}  // namespace idemgate::http
