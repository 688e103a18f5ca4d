// Asio's TLS implementation (boost::asio::ssl over OpenSSL), compiled once
// like asio_impl.cc. Link idemgate_asio_ssl to use boost::asio::ssl.
#include <boost/asio/ssl/impl/src.hpp>
