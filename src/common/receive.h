#pragma once

// Receives that know when they emptied the socket.
//
// Asio's epoll reactor tries every async_read_some with a receive first
// ("speculative") and waits for epoll only when that receive fails. Boost
// 1.81 treats a socket as drained only after a receive of 0 bytes, so in a
// request/response exchange nearly every read paid one failed recvfrom
// (EAGAIN) before waiting: after the gateway forwards a request it reads the
// upstream at once, after it answers a client it reads the client at once,
// and after it sends Redis a command it reads the reply at once, and none of
// them has written yet. Measured on the benchmark: 3.6 recvfrom
// per proxied request, 1.7 of them failed, where nginx makes 2.0 and none.
//
// With TCP_INQ (Linux 4.18) every recvmsg also reports how many bytes are
// left in the receive queue, and a non-zero count once the peer's FIN has
// arrived. A receive through a DrainAwareBuffer reads with recvmsg and
// reports "done and exhausted" to the reactor when that count is 0, the
// status Asio's own operations use to stop speculating: the next read waits
// for epoll's next edge, which the kernel raises for any later byte or FIN.
// The reactor records that status under its descriptor lock in the same step
// as the receive, so no arrival can be missed between the two. One arrival
// the count does not show: a reset (the kernel marks only a FIN). A reset
// that came right behind the bytes just read raises no further edge, so a
// reader that got part of a message and waits for the rest first tries one
// receive without waiting (ReceiveNow in http/internal/io.h). Without the
// hint (option not set, other kernels) the count is absent and reads behave
// exactly as Asio's.
//
// The hook is an explicit specialisation of Asio's receive-operation base
// for DrainAwareBuffer, so handler allocation, completion, cancellation and
// work tracking stay Asio's. It depends on Asio's internals, which is why
// the build pins Boost 1.81 (find_package ... EXACT) and this header checks
// the version: review the specialisation against reactive_socket_recv_op.hpp
// before moving to another Boost.
//
// Used by the HTTP server and proxy (src/http) and the Redis connections.

#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
// After ip/tcp.hpp: this detail header uses socket_base without including it.
#include <boost/asio/detail/reactive_socket_recv_op.hpp>
#include <boost/version.hpp>
#include <cstdint>

static_assert(BOOST_VERSION == 108100,
              "common/receive.h specialises Asio 1.81's reactive_socket_recv_op_base; check it against "
              "this Boost's boost/asio/detail/reactive_socket_recv_op.hpp");

namespace idemgate {

// One contiguous receive buffer whose receive reports a drained socket.
struct DrainAwareBuffer : boost::asio::mutable_buffer {
  explicit DrainAwareBuffer(boost::asio::mutable_buffer b) : boost::asio::mutable_buffer(b) {}
};

// Asks the kernel to report the bytes left after each receive (TCP_INQ).
// Returns false when the option is not available; reads then work as before.
bool EnableReceiveQueueHint(boost::asio::ip::tcp::socket& socket);

// Receive attempts through DrainAwareBuffer made on this thread.
struct ReceiveCounters {
  std::uint64_t attempts = 0;     // recvmsg calls
  std::uint64_t would_block = 0;  // ... that found nothing (EAGAIN)
  std::uint64_t drained = 0;      // ... that left the queue empty, with no FIN
};
ReceiveCounters& ThisThreadReceiveCounters();

}  // namespace idemgate

namespace boost::asio::detail {

template <>
class reactive_socket_recv_op_base<idemgate::DrainAwareBuffer> : public reactor_op {
 public:
  reactive_socket_recv_op_base(const boost::system::error_code& success_ec, socket_type socket,
                               socket_ops::state_type state, const idemgate::DrainAwareBuffer& buffer,
                               socket_base::message_flags flags, func_type complete_func)
      : reactor_op(success_ec, &reactive_socket_recv_op_base::do_perform, complete_func),
        socket_(socket),
        state_(state),
        buffer_(buffer),
        flags_(flags) {}

  static status do_perform(reactor_op* base);

 private:
  socket_type socket_;
  socket_ops::state_type state_;
  boost::asio::mutable_buffer buffer_;
  socket_base::message_flags flags_;
};

}  // namespace boost::asio::detail
