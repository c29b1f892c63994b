#include "bench/service_load/server_child.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bare_rendezvous.h"
#include "bench/service_load/settings.h"
#include "server/planner_server.h"

namespace knapformer {
namespace service_load {
namespace {

// The server a child runs: a PlannerServer or the bare rendezvous, whichever
// StartChildServer was asked for, listening on `port`.
struct ChildServer {
  std::unique_ptr<PlannerServer> planner;
  BareRendezvousServer bare;
  int32_t port = 0;

  void Stop() {
    if (planner != nullptr) planner->Shutdown(kServerShutdownGrace);
    if (bare.server != nullptr) {
      bare.server->Shutdown(absl::ToChronoTime(absl::Now() + kServerShutdownGrace));
      bare.server->Wait();
    }
  }
};

absl::StatusOr<ChildServer> StartChildServer(ServerKind kind) {
  ChildServer child;
  if (kind == ServerKind::kBareRendezvous) {
    absl::StatusOr<BareRendezvousServer> bare = StartBareRendezvous(kBareReplyPaddingBytes);
    if (!bare.ok()) return bare.status();
    child.bare = *std::move(bare);
    child.port = child.bare.port;
    return child;
  }
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address.clear();
  options.service.limits.max_world_size = kMaxWorldSize;
  options.service.limits.rendezvous_timeout = kRendezvousTimeout;
  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(options);
  if (!server.ok()) return server.status();
  child.planner = *std::move(server);
  child.port = child.planner->port();
  return child;
}

// Closes every descriptor above stderr but `a` and `b`: close_range where
// the kernel has it (5.9+), else one by one.
void CloseAllFdsBut(int a, int b) {
  const int low = std::min(a, b);
  const int high = std::max(a, b);
  const bool ranged = (low <= 3 || close_range(3, low - 1, 0) == 0) &&
                      (high <= low + 1 || close_range(low + 1, high - 1, 0) == 0) &&
                      close_range(high + 1, ~0U, 0) == 0;
  if (ranged) return;
  const long most = std::min(sysconf(_SC_OPEN_MAX), 1L << 20);
  for (int fd = 3; fd < most; ++fd) {
    if (fd != a && fd != b) close(fd);
  }
}

// Runs in the child, which has no threads yet. Never returns.
[[noreturn]] void RunServerChild(ServerKind kind, pid_t parent, int port_fd, int stop_fd) {
  // SIGTERM is taken through a signalfd, so it is blocked before the server
  // starts any thread (threads inherit the mask). The parent's death is seen
  // as EOF on stop_fd, and also turned into a SIGTERM.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, nullptr);
  const int signal_fd = signalfd(-1, &term, SFD_CLOEXEC);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);

  absl::StatusOr<ChildServer> server = StartChildServer(kind);
  if (!server.ok()) {
    std::fprintf(stderr, "server child: %s\n", server.status().ToString().c_str());
    _exit(1);
  }
  const int32_t port = server->port;
  if (write(port_fd, &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) _exit(1);
  close(port_fd);

  while (true) {
    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    const int n = poll(fds, signal_fd >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (fds[1].revents != 0) break;  // SIGTERM
    if (fds[0].revents != 0) {
      char byte;
      const ssize_t got = read(stop_fd, &byte, 1);
      if (got < 0 && errno == EINTR) continue;
      break;  // EOF (the parent closed its end or died) or anything written
    }
  }
  server->Stop();
  _exit(0);
}

}  // namespace

bool ServerProcess::Start() {
  int port_pipe[2];
  int stop_pipe[2];
  if (pipe2(port_pipe, O_CLOEXEC) != 0) {
    std::perror("pipe");
    return false;
  }
  if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
    std::perror("pipe");
    close(port_pipe[0]);
    close(port_pipe[1]);
    return false;
  }
  const pid_t parent = getpid();
  const absl::Status forked = child_.Fork([&] {
    // Only this child's own pipe ends: a child that kept an earlier
    // child's stop pipe open kept that child from ever seeing EOF, so
    // every server child but the last was killed after kChildExitWaitMs.
    CloseAllFdsBut(port_pipe[1], stop_pipe[0]);
    RunServerChild(kind_, parent, port_pipe[1], stop_pipe[0]);
  });
  if (!forked.ok()) {
    std::fprintf(stderr, "%s\n", std::string(forked.message()).c_str());
    for (int fd : {port_pipe[0], port_pipe[1], stop_pipe[0], stop_pipe[1]}) close(fd);
    return false;
  }
  close(port_pipe[1]);
  close(stop_pipe[0]);
  stop_fd_ = stop_pipe[1];

  using Clock = std::chrono::steady_clock;
  int32_t port = 0;
  size_t have = 0;
  const Clock::time_point until = Clock::now() + std::chrono::milliseconds(kPortWaitMs);
  while (have < sizeof(port)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) break;
    pollfd fd = {port_pipe[0], POLLIN, 0};
    const int n = poll(&fd, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const ssize_t got =
        read(port_pipe[0], reinterpret_cast<char*>(&port) + have, sizeof(port) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
  }
  close(port_pipe[0]);
  if (have != sizeof(port) || port <= 0) {
    std::fprintf(stderr, "server child %d did not report a port within %d ms (%s)\n",
                 static_cast<int>(pid()), kPortWaitMs, Stop().c_str());
    return false;
  }
  port_ = port;
  return true;
}

std::string ServerProcess::Stop() {
  if (stop_fd_ >= 0) {
    close(stop_fd_);
    stop_fd_ = -1;
  }
  return child_.Stop(absl::Milliseconds(kChildExitWaitMs));
}

}  // namespace service_load
}  // namespace knapformer
