#include "launch/fork_server.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iostream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {
namespace {

// A request is one SOCK_SEQPACKET message: the signals the launcher ignores
// and those it blocks (two uint64_t, bit s-1 for signal s), then the log
// path and each environment entry, each ended by a NUL (neither can hold
// one). The answer is an int64_t: the copy's pid, or -errno.
constexpr size_t kSignalBytes = 2 * sizeof(uint64_t);
constexpr size_t kMaxRequest = 1 << 20;
constexpr int kMaxSignal = 64;
constexpr int kAnswerTimeoutMs = 10000;

struct Launcher {
  absl::Mutex mu;
  int fd ABSL_GUARDED_BY(mu) = -1;  // our end of the server's socket
  pid_t server ABSL_GUARDED_BY(mu) = -1;
};

Launcher& TheLauncher() {
  static auto* launcher = new Launcher();
  return *launcher;
}

int CountThreads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int threads = 0;
  while (const dirent* entry = readdir(dir)) threads += entry->d_name[0] != '.';
  closedir(dir);
  return threads;
}

// What an executed copy would inherit of the launcher's signals: those it
// ignores stay ignored and its mask stays (those it handles are reset, which
// the server's are: it has run only the binary's own initialisers). Gloo,
// for one, writes to a peer's closed socket; a launcher that had ignored
// SIGPIPE gave its copies a failed write there rather than death by signal.
void LaunchersSignals(uint64_t* ignored, uint64_t* blocked) {
  *ignored = *blocked = 0;
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  for (int sig = 1; sig <= kMaxSignal && sig < NSIG; ++sig) {
    struct sigaction action;
    if (sigaction(sig, nullptr, &action) == 0 && !(action.sa_flags & SA_SIGINFO) &&
        action.sa_handler == SIG_IGN) {
      *ignored |= uint64_t{1} << (sig - 1);
    }
    if (sigismember(&mask, sig) == 1) *blocked |= uint64_t{1} << (sig - 1);
  }
}

void TakeSignals(uint64_t ignored, uint64_t blocked) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig = 1; sig <= kMaxSignal && sig < NSIG; ++sig) {
    if (ignored & (uint64_t{1} << (sig - 1))) signal(sig, SIG_IGN);
    if (blocked & (uint64_t{1} << (sig - 1))) sigaddset(&mask, sig);
  }
  sigprocmask(SIG_SETMASK, &mask, nullptr);
}

// In a new copy: the request's signals, environment and output. Exits 127
// (as a failed exec would) if the log cannot be opened.
void BecomeCopy(const std::string& message) {
  uint64_t signals[2];
  std::memcpy(signals, message.data(), kSignalBytes);
  TakeSignals(signals[0], signals[1]);
  const std::string request = message.substr(kSignalBytes);
  std::vector<std::string> fields;
  for (size_t begin = 0; begin < request.size();) {
    const size_t end = std::min(request.find('\0', begin), request.size());
    fields.push_back(request.substr(begin, end - begin));
    begin = end + 1;
  }
  clearenv();
  for (size_t i = 1; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    if (eq == std::string::npos || eq == 0) continue;
    setenv(fields[i].substr(0, eq).c_str(), fields[i].substr(eq + 1).c_str(), 1);
  }
  const std::string& log_path = fields.empty() ? std::string() : fields[0];
  if (log_path.empty()) return;
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0) {
    std::cerr << "fork server: cannot write " << log_path << ": " << std::strerror(errno) << "\n";
    _exit(127);
  }
  close(log);
}

// Reads all of `size` bytes; false at EOF or on an error.
bool ReadFully(int fd, void* data, size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The server's loop. Each copy is forked by a short-lived middle process,
// so that it is orphaned at once and adopted by the launcher (a subreaper),
// which can then wait for it as for its own child. Returns only in a copy;
// the server itself exits when the launcher closes the socket.
void ServeCopies(int fd) {
  std::string request(kMaxRequest, '\0');
  for (;;) {
    const ssize_t n = recv(fd, request.data(), request.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(0);  // the launcher has gone
    int64_t answer = 0;
    if (static_cast<size_t>(n) < kSignalBytes) {  // not from ForkCopy
      answer = -EINVAL;
      if (send(fd, &answer, sizeof answer, MSG_NOSIGNAL) != sizeof answer) _exit(0);
      continue;
    }
    int pid_pipe[2];
    if (pipe2(pid_pipe, O_CLOEXEC) != 0) {
      answer = -errno;
    } else {
      const pid_t middle = fork();
      if (middle == 0) {
        close(pid_pipe[0]);
        const pid_t copy = fork();
        if (copy == 0) {
          close(pid_pipe[1]);
          close(fd);
          BecomeCopy(request.substr(0, static_cast<size_t>(n)));
          return;
        }
        const int64_t sent = copy > 0 ? copy : -errno;
        _exit(write(pid_pipe[1], &sent, sizeof sent) == sizeof sent ? 0 : 1);
      }
      close(pid_pipe[1]);
      if (middle < 0) {
        answer = -errno;
      } else {
        if (!ReadFully(pid_pipe[0], &answer, sizeof answer)) answer = -ECHILD;
        // Once the middle process is reaped, its copy has been adopted.
        while (waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      close(pid_pipe[0]);
    }
    if (send(fd, &answer, sizeof answer, MSG_NOSIGNAL) != sizeof answer) _exit(0);
  }
}

}  // namespace

bool StartForkServer() {
  Launcher& launcher = TheLauncher();
  absl::MutexLock lock(&launcher.mu);
  if (launcher.fd >= 0 || CountThreads() != 1) return false;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return false;
  // Orphans below this process are adopted by it rather than by init, so
  // that it can wait for the copies the server forks.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  const pid_t launcher_pid = getpid();
  fflush(nullptr);  // nothing buffered is written twice
  std::cout.flush();
  std::cerr.flush();
  const pid_t server = fork();
  if (server < 0) {
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (server == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the launcher
    if (getppid() != launcher_pid) _exit(0);
    ServeCopies(fds[1]);
    // A copy (the lock is released on return, as in the server it came
    // from): it owns nothing of the launcher's.
    launcher.fd = -1;
    launcher.server = -1;
    return true;
  }
  close(fds[1]);
  launcher.fd = fds[0];
  launcher.server = server;
  return false;
}

absl::StatusOr<pid_t> ForkCopy(const std::vector<std::string>& env, const std::string& log_path) {
  uint64_t signals[2];
  LaunchersSignals(&signals[0], &signals[1]);
  std::string request(reinterpret_cast<const char*>(signals), kSignalBytes);
  request += log_path;
  request.push_back('\0');
  for (const std::string& entry : env) {
    request += entry;
    request.push_back('\0');
  }
  if (request.size() > kMaxRequest) {
    return absl::UnavailableError(absl::StrCat("fork server: the environment is ",
                                               request.size(), " bytes, over ", kMaxRequest));
  }
  Launcher& launcher = TheLauncher();
  absl::MutexLock lock(&launcher.mu);
  if (launcher.fd < 0) return absl::UnavailableError("fork server: none is running");
  int64_t answer = 0;
  pollfd ready = {launcher.fd, POLLIN, 0};
  if (send(launcher.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size()) ||
      poll(&ready, 1, kAnswerTimeoutMs) != 1 ||
      recv(launcher.fd, &answer, sizeof answer, 0) != sizeof answer) {
    // Gone or stuck: stop using it (later copies are executed afresh).
    const std::string why = std::strerror(errno);
    close(launcher.fd);
    kill(launcher.server, SIGKILL);
    waitpid(launcher.server, nullptr, 0);
    launcher.fd = -1;
    return absl::UnavailableError(absl::StrCat("fork server: no answer (", why, ")"));
  }
  if (answer <= 0) {
    return absl::UnavailableError(
        absl::StrCat("fork server: fork: ", std::strerror(static_cast<int>(-answer))));
  }
  return static_cast<pid_t>(answer);
}

}  // namespace knapformer
