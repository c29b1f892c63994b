#include "launch/child_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace knapformer {

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")", WCOREDUMP(status) ? ", core dumped" : "");
  }
  return absl::StrCat("wait status ", status);
}

int ExitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0 || reaped_) return;
  kill(pid_, SIGKILL);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

absl::Status ChildProcess::Spawn(const std::vector<std::string>& argv,
                                 const ChildOutput& output) {
  if (pid_ > 0) return absl::FailedPreconditionError("a child was already started");
  if (argv.empty()) return absl::InvalidArgumentError("no argv[0] to spawn");
  std::vector<std::string> args = argv;
  std::vector<char*> raw;
  for (std::string& a : args) raw.push_back(a.data());
  raw.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  auto redirect = [&actions](int fd, const std::string& path) {
    if (path.empty()) return;
    posix_spawn_file_actions_addopen(&actions, fd, path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
  };
  redirect(1, output.stdout_path);
  redirect(2, output.stderr_path);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, raw[0], &actions, nullptr, raw.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return absl::InternalError(absl::StrCat(argv[0], ": ", strerror(error)));
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status ChildProcess::Fork(const std::function<void()>& run) {
  if (pid_ > 0) return absl::FailedPreconditionError("a child was already started");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    run();
    _exit(1);
  }
  pid_ = pid;
  return absl::OkStatus();
}

void ChildProcess::Reaped(int status, std::string how) {
  reaped_ = true;
  exit_code_ = ExitCodeOf(status);
  how_ = std::move(how);
}

std::string ChildProcess::ExitIfEnded() {
  if (pid_ <= 0) return "not started";
  if (reaped_) return how_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) Reaped(status, DescribeWaitStatus(status));
  return reaped_ ? how_ : "";
}

bool ChildProcess::WaitFor(absl::Duration timeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + absl::ToChronoNanoseconds(timeout);
  while (ExitIfEnded().empty()) {
    if (Clock::now() >= until) return false;
    usleep(10 * 1000);
  }
  return true;
}

void ChildProcess::Signal(int signal_number) {
  if (pid_ > 0 && !reaped_) kill(pid_, signal_number);
}

std::string ChildProcess::Stop(absl::Duration grace) {
  if (WaitFor(grace)) return ExitIfEnded();
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  Reaped(status, absl::StrCat("did not exit within ", absl::ToInt64Milliseconds(grace),
                              " ms of being asked to, killed (", DescribeWaitStatus(status), ")"));
  return how_;
}

int64_t ChildProcess::StatusBytes(absl::string_view key) const {
  std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kb = 0;
    if (absl::StartsWith(line, key) &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                             absl::string_view(line).substr(key.size()), "kB")),
                         &kb)) {
      return kb * 1024;
    }
  }
  return -1;
}

int64_t ChildProcess::RssBytes() const { return StatusBytes("VmRSS:"); }

int64_t ChildProcess::PeakRssBytes() const { return StatusBytes("VmHWM:"); }

int ChildProcess::OpenFds() const {
  const std::string dir = absl::StrCat("/proc/", pid_, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(d)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(d);
  return count;
}

std::optional<double> ChildProcess::CpuSeconds() const {
  if (pid_ <= 0 || reaped_) return std::nullopt;
  std::ifstream in(absl::StrCat("/proc/", pid_, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return std::nullopt;
  // After "pid (comm)": field 3 (state) onwards; utime and stime are 14, 15.
  std::istringstream fields(text.substr(paren + 1));
  std::string skip;
  for (int field = 3; field <= 13; ++field) fields >> skip;
  unsigned long long utime = 0, stime = 0;
  if (!(fields >> utime >> stime)) return std::nullopt;
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace knapformer
