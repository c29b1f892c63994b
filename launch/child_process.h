#ifndef KNAPFORMER_LAUNCH_CHILD_PROCESS_H_
#define KNAPFORMER_LAUNCH_CHILD_PROCESS_H_

// One child process's lifetime, for the service's load benchmark (a server
// forked in-process) and its process tests (the `knapformer serve` binary):
// start it, see whether it has ended and how, wait for it (always bounded),
// signal it, stop it (a grace period, then SIGKILL), and read its /proc
// figures. The destructor kills and reaps a child still running, so no way
// out of the caller leaves one behind.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace knapformer {

// How a waitpid status reads: "exited with status N", "killed by signal N
// (name)[, core dumped]", else "wait status N".
std::string DescribeWaitStatus(int status);

// A waitpid status as one exit code: the exit status, or 128 + the signal
// that ended the process (as a shell reports it).
int ExitCodeOf(int status);

// Where a spawned child's output goes: a file (created or truncated, 0644;
// "/dev/null" discards it), or, if empty, this process's.
struct ChildOutput {
  std::string stdout_path;
  std::string stderr_path;
};

class ChildProcess {
 public:
  ChildProcess() = default;
  // Kills (SIGKILL) and reaps a child that has not been reaped.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Starts the binary at the path argv[0] with `argv` and this process's
  // environment. At most one start per object.
  absl::Status Spawn(const std::vector<std::string>& argv, const ChildOutput& output = {});

  // Forks a child that runs `run`, which is to end it with _exit (a child
  // whose `run` returns exits with status 1). This process's stdio buffers
  // are flushed first, so that the child does not write them again. The
  // error reads "fork: <reason>". At most one start per object.
  absl::Status Fork(const std::function<void()>& run);

  // -1 until started.
  pid_t pid() const { return pid_; }

  // Empty while the child runs; once it has ended (reaping it), how
  // (DescribeWaitStatus, or Stop's account of a kill); "not started" if it
  // never was.
  std::string ExitIfEnded();

  // Waits up to `timeout` (polling every 10 ms; at least one look) for the
  // child to end. True once it has ended (or never started).
  bool WaitFor(absl::Duration timeout);

  // Sends `signal_number` to a child not yet reaped.
  void Signal(int signal_number);

  // Waits up to `grace` for the child to end (the caller has asked it to),
  // then kills (SIGKILL) and reaps it. Returns how it ended, as
  // ExitIfEnded does; after a kill, "did not exit within N ms of being
  // asked to, killed (...)". Idempotent.
  std::string Stop(absl::Duration grace);

  // Once reaped: its exit status, or 128 + the signal that ended it; -1
  // before (or if it never started).
  int exit_code() const { return exit_code_; }

  // Its resident set (VmRSS), and the most it has been (VmHWM), bytes; -1
  // if unreadable.
  int64_t RssBytes() const;
  int64_t PeakRssBytes() const;
  // Its open file descriptors; -1 if unreadable.
  int OpenFds() const;
  // utime + stime of the child (all its threads), seconds; nullopt once
  // reaped, or if unreadable.
  std::optional<double> CpuSeconds() const;

 private:
  // The /proc/<pid>/status line that starts with `key` ("VmRSS:"), in
  // bytes; -1 if unreadable.
  int64_t StatusBytes(absl::string_view key) const;
  // Records a reaped child's wait status and `how` it ended.
  void Reaped(int status, std::string how);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string how_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_LAUNCH_CHILD_PROCESS_H_
