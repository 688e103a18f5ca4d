// The one translation unit that compiles Asio's and Beast's implementation
// (BOOST_ASIO_SEPARATE_COMPILATION / BOOST_BEAST_SEPARATE_COMPILATION), so the
// other files only parse declarations. This keeps full builds on two cores fast.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
