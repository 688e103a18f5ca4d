#include "common/receive.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace idemgate {

namespace {
thread_local ReceiveCounters t_counters;
}  // namespace

ReceiveCounters& ThisThreadReceiveCounters() { return t_counters; }

bool EnableReceiveQueueHint(boost::asio::ip::tcp::socket& socket) {
#ifdef TCP_INQ
  const int one = 1;
  return ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_INQ, &one, sizeof(one)) == 0;
#else
  (void)socket;
  return false;
#endif
}

}  // namespace idemgate

namespace boost::asio::detail {

// The same contract as Asio's do_perform for a stream socket (see
// non_blocking_recv1): not_done on EAGAIN, done with the bytes or the error,
// eof for a receive of 0 bytes, done_and_exhausted when there is nothing
// more to read right now. The one addition: "nothing more" also when the
// kernel's TCP_INQ count says the queue is empty and no FIN has arrived.
reactor_op::status reactive_socket_recv_op_base<idemgate::DrainAwareBuffer>::do_perform(
    reactor_op* base) {
  auto* o = static_cast<reactive_socket_recv_op_base*>(base);
  idemgate::ReceiveCounters& counters = idemgate::ThisThreadReceiveCounters();
  iovec iov{o->buffer_.data(), o->buffer_.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  for (;;) {
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ++counters.attempts;
    const ssize_t n = ::recvmsg(o->socket_, &msg, o->flags_);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        ++counters.would_block;
        return not_done;
      }
      o->ec_ = boost::system::error_code(err, boost::asio::error::get_system_category());
      o->bytes_transferred_ = 0;
      return done_and_exhausted;
    }
    if (n == 0) {
      // The end of the stream: Asio completes a receive into an empty
      // buffer without performing it, so 0 bytes is never a full buffer.
      if ((o->state_ & socket_ops::stream_oriented) != 0) o->ec_ = boost::asio::error::eof;
      o->bytes_transferred_ = 0;
      return done_and_exhausted;
    }
    o->bytes_transferred_ = static_cast<std::size_t>(n);
#ifdef TCP_CM_INQ
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == IPPROTO_TCP && c->cmsg_type == TCP_CM_INQ && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int left = 0;
        std::memcpy(&left, CMSG_DATA(c), sizeof(left));
        if (left == 0) {
          ++counters.drained;
          return done_and_exhausted;
        }
        break;
      }
    }
#endif
    return done;
  }
}

}  // namespace boost::asio::detail
