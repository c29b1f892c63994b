#include "tests/client/slow_connect_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace knapformer {
namespace {

constexpr int kPollMs = 50;  // how soon a stopping proxy notices

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

// Writes all of data; false once the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SlowConnectProxy>> SlowConnectProxy::Start(int target_port,
                                                                           absl::Duration delay) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("cannot listen on 127.0.0.1:0 (errno ", errno, ")"));
  }
  std::unique_ptr<SlowConnectProxy> proxy(
      new SlowConnectProxy(fd, ntohs(address.sin_port), target_port, delay));
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

SlowConnectProxy::SlowConnectProxy(int listen_fd, int port, int target_port,
                                   absl::Duration delay)
    : listen_fd_(listen_fd), port_(port), target_port_(target_port), delay_(delay) {}

SlowConnectProxy::~SlowConnectProxy() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  for (std::thread& t : forwarders_) t.join();
}

void SlowConnectProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd ready{listen_fd_, POLLIN, 0};
    if (poll(&ready, 1, kPollMs) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    ++connections_;
    absl::MutexLock lock(&mu_);
    forwarders_.emplace_back([this, client] { Forward(client); });
  }
}

void SlowConnectProxy::Forward(int client_fd) {
  const absl::Time forward_at = absl::Now() + delay_;
  while (!stopping_ && absl::Now() < forward_at) absl::SleepFor(absl::Milliseconds(kPollMs) / 5);
  const int service_fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in target = Loopback(target_port_);
  if (stopping_ || service_fd < 0 ||
      connect(service_fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) {
    if (service_fd >= 0) close(service_fd);
    close(client_fd);
    return;
  }
  pollfd fds[2] = {{client_fd, POLLIN, 0}, {service_fd, POLLIN, 0}};
  char buffer[65536];
  bool open = true;
  while (open && !stopping_) {
    if (poll(fds, 2, kPollMs) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = recv(fds[i].fd, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      open = n > 0 && WriteAll(fds[1 - i].fd, buffer, n);
    }
  }
  close(service_fd);
  close(client_fd);
}

}  // namespace knapformer
