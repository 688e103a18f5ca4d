// Receives through DrainAwareBuffer (src/common/receive.h): a receive
// that empties the socket makes the next read wait for epoll instead of
// trying a recvmsg that fails, and the end of the stream is never left unseen.
#include "common/receive.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <array>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <string>
#include <string_view>
#include <thread>

namespace idemgate {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using namespace std::chrono_literals;

struct Outcome {
  bool done = false;
  error_code ec;
  std::size_t n = 0;
};

class DrainAwareReceiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tcp::acceptor acceptor(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    peer_.connect(acceptor.local_endpoint());
    acceptor.accept(server_);
    server_.non_blocking(true);
  }

  // Starts one receive of at most `size` bytes into buf_.
  void Start(Outcome& out, std::size_t size = 64) {
    out = Outcome{};
    server_.async_read_some(DrainAwareBuffer(asio::buffer(buf_.data(), size)),
                            [&out](const error_code& ec, std::size_t n) {
                              out.done = true;
                              out.ec = ec;
                              out.n = n;
                            });
  }
  // Runs ready handlers only; a receive waiting for epoll stays pending.
  void RunReady() {
    io_.restart();
    io_.poll();
  }
  // Starts a receive and runs what is ready: `out` is done only when the
  // receive completed without waiting for epoll.
  void StartAndRunReady(Outcome& out, std::size_t size = 64) {
    Start(out, size);
    RunReady();
  }
  void RunUntilDone(const Outcome& out) {
    io_.restart();
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!out.done && std::chrono::steady_clock::now() < until) io_.run_one_for(100ms);
  }
  std::string Got(const Outcome& out) const { return std::string(buf_.data(), out.n); }

  // Writes from the peer and waits until the server's socket holds `bytes`.
  void PeerWrite(std::string_view bytes) {
    asio::write(peer_, asio::buffer(bytes.data(), bytes.size()));
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (server_.available() < bytes.size() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_GE(server_.available(), bytes.size());
  }
  // Ends the peer's side and waits until the server's socket has seen the FIN.
  void PeerFinish() {
    peer_.shutdown(tcp::socket::shutdown_send);
    pollfd p{server_.native_handle(), POLLRDHUP, 0};
    ASSERT_EQ(::poll(&p, 1, 5000), 1);
    ASSERT_TRUE(p.revents & POLLRDHUP);
  }

  asio::io_context io_;
  tcp::socket peer_{io_};
  tcp::socket server_{io_};
  std::array<char, 64> buf_{};
};

TEST_F(DrainAwareReceiveTest, AReceiveThatEmptiesTheSocketMakesTheNextReadWaitForEpoll) {
  ASSERT_TRUE(EnableReceiveQueueHint(server_));
  const ReceiveCounters before = ThisThreadReceiveCounters();
  PeerWrite("hello");
  Outcome first;
  StartAndRunReady(first);
  ASSERT_TRUE(first.done);
  ASSERT_FALSE(first.ec) << first.ec.message();
  EXPECT_EQ(Got(first), "hello");
  EXPECT_EQ(ThisThreadReceiveCounters().attempts - before.attempts, 1u);
  EXPECT_EQ(ThisThreadReceiveCounters().drained - before.drained, 1u);

  // Nothing has arrived: no receive is tried, the read waits.
  Outcome second;
  StartAndRunReady(second);
  EXPECT_FALSE(second.done);
  EXPECT_EQ(ThisThreadReceiveCounters().attempts - before.attempts, 1u);

  PeerWrite("again");
  RunUntilDone(second);
  ASSERT_TRUE(second.done);
  ASSERT_FALSE(second.ec) << second.ec.message();
  EXPECT_EQ(Got(second), "again");
  EXPECT_EQ(ThisThreadReceiveCounters().attempts - before.attempts, 2u);
  EXPECT_EQ(ThisThreadReceiveCounters().would_block - before.would_block, 0u);
}

TEST_F(DrainAwareReceiveTest, BytesLeftInTheSocketAreReadWithoutWaiting) {
  ASSERT_TRUE(EnableReceiveQueueHint(server_));
  const ReceiveCounters before = ThisThreadReceiveCounters();
  PeerWrite("0123456789");
  std::string all;
  for (const std::string_view want : {"0123", "4567", "89"}) {
    Outcome out;
    StartAndRunReady(out, 4);
    ASSERT_TRUE(out.done) << "after " << all;
    ASSERT_FALSE(out.ec) << out.ec.message();
    EXPECT_EQ(Got(out), want);
    all += Got(out);
  }
  EXPECT_EQ(all, "0123456789");
  EXPECT_EQ(ThisThreadReceiveCounters().attempts - before.attempts, 3u);
  EXPECT_EQ(ThisThreadReceiveCounters().drained - before.drained, 1u);
}

TEST_F(DrainAwareReceiveTest, AFinBehindTheLastBytesIsSeenWithoutWaiting) {
  ASSERT_TRUE(EnableReceiveQueueHint(server_));
  const ReceiveCounters before = ThisThreadReceiveCounters();
  PeerWrite("bye");
  PeerFinish();
  Outcome last;
  StartAndRunReady(last);
  ASSERT_TRUE(last.done);
  ASSERT_FALSE(last.ec) << last.ec.message();
  EXPECT_EQ(Got(last), "bye");
  // The queue is empty but the FIN is there: not reported as drained.
  EXPECT_EQ(ThisThreadReceiveCounters().drained - before.drained, 0u);

  Outcome end;
  StartAndRunReady(end);
  ASSERT_TRUE(end.done) << "the end of the stream was left unseen";
  EXPECT_EQ(end.ec, asio::error::eof);
}

TEST_F(DrainAwareReceiveTest, WithoutTheHintEveryReadTriesAReceiveFirst) {
  const ReceiveCounters before = ThisThreadReceiveCounters();
  PeerWrite("x");
  Outcome first;
  StartAndRunReady(first);
  ASSERT_TRUE(first.done);
  EXPECT_EQ(Got(first), "x");
  EXPECT_EQ(ThisThreadReceiveCounters().drained - before.drained, 0u);

  Outcome second;
  StartAndRunReady(second);
  EXPECT_FALSE(second.done);
  EXPECT_EQ(ThisThreadReceiveCounters().would_block - before.would_block, 1u);
  PeerWrite("y");
  RunUntilDone(second);
  ASSERT_TRUE(second.done);
  EXPECT_EQ(Got(second), "y");
}

TEST_F(DrainAwareReceiveTest, AWaitingReadIsCancelledWithTheSocket) {
  ASSERT_TRUE(EnableReceiveQueueHint(server_));
  PeerWrite("z");
  Outcome first;
  StartAndRunReady(first);
  ASSERT_TRUE(first.done);

  Outcome waiting;
  StartAndRunReady(waiting);
  ASSERT_FALSE(waiting.done);
  server_.cancel();
  RunReady();
  ASSERT_TRUE(waiting.done);
  EXPECT_EQ(waiting.ec, asio::error::operation_aborted);
}

TEST_F(DrainAwareReceiveTest, AResetIsReportedAsAnError) {
  ASSERT_TRUE(EnableReceiveQueueHint(server_));
  // Closing with a zero linger time sends a reset instead of a FIN.
  peer_.set_option(asio::socket_base::linger(true, 0));
  peer_.close();
  pollfd p{server_.native_handle(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  Outcome out;
  Start(out);
  RunUntilDone(out);
  ASSERT_TRUE(out.done);
  EXPECT_EQ(out.ec, asio::error::connection_reset) << out.ec.message();
  EXPECT_EQ(out.n, 0u);
}

}  // namespace
}  // namespace idemgate
