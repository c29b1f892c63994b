// The fork server: a copy starts with exactly the environment and output it
// was given, is the launcher's to wait for and kill, and no server is made
// where it would not be safe.

#include "launch/fork_server.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

extern char** environ;

namespace knapformer {
namespace {

constexpr char kActionVar[] = "FORK_TEST_ACTION";

// What a copy does, by its FORK_TEST_ACTION: "env" prints its environment,
// one entry a line; "exit:N" exits N; "sleep" waits to be killed;
// "signals" prints whether it ignores SIGPIPE and blocks SIGUSR1;
// "threads" tries to make a server of its own with a second thread running.
int CopyMain() {
  const char* action = std::getenv(kActionVar);
  const std::string what = action != nullptr ? action : "";
  if (what == "env") {
    for (char** e = environ; *e != nullptr; ++e) std::cout << *e << "\n";
    return 0;
  }
  if (absl::StartsWith(what, "exit:")) return std::atoi(what.c_str() + 5);
  if (what == "sleep") {
    for (;;) pause();
  }
  if (what == "signals") {
    struct sigaction pipe_action;
    sigaction(SIGPIPE, nullptr, &pipe_action);
    sigset_t mask;
    pthread_sigmask(SIG_BLOCK, nullptr, &mask);
    std::cout << "SIGPIPE " << (pipe_action.sa_handler == SIG_IGN ? "ignored" : "not ignored")
              << "\nSIGUSR1 " << (sigismember(&mask, SIGUSR1) == 1 ? "blocked" : "not blocked")
              << "\n";
    return 0;
  }
  if (what == "threads") {
    std::thread sleeper([] { std::this_thread::sleep_for(std::chrono::seconds(2)); });
    const bool refused = !StartForkServer() && !ForkCopy({}, "").ok();
    sleeper.join();
    return refused ? 0 : 1;
  }
  std::cerr << "copy: no action\n";
  return 2;
}

std::string LogPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/fork_server_", getpid(), "_", name,
                      ".log");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// waitpid with a bound: the status, or -1 if the copy is not this
// process's child or did not end within 60 s (then it is killed).
int WaitBounded(pid_t pid) {
  for (int i = 0; i < 6000; ++i) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return status;
    if (got < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

TEST(ForkServer, ACopyHasExactlyTheGivenEnvironmentAndOutput) {
  const std::string log = LogPath("env");
  auto pid = ForkCopy({absl::StrCat(kActionVar, "=env"), "A=1", "B=x=y", "EMPTY="}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = WaitBounded(*pid);  // the launcher's child, though the server forked it
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::vector<std::string> lines = absl::StrSplit(ReadAll(log), '\n', absl::SkipEmpty());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"A=1", "B=x=y", "EMPTY=",
                                             absl::StrCat(kActionVar, "=env")}));
}

TEST(ForkServer, ExitCodesAndSignalsReachTheLauncher) {
  auto exits = ForkCopy({absl::StrCat(kActionVar, "=exit:7")}, LogPath("exit"));
  auto sleeps = ForkCopy({absl::StrCat(kActionVar, "=sleep")}, LogPath("sleep"));
  ASSERT_TRUE(exits.ok()) << exits.status();
  ASSERT_TRUE(sleeps.ok()) << sleeps.status();
  const int exit_status = WaitBounded(*exits);
  ASSERT_TRUE(WIFEXITED(exit_status)) << exit_status;
  EXPECT_EQ(WEXITSTATUS(exit_status), 7);
  ASSERT_EQ(kill(*sleeps, SIGKILL), 0);
  const int kill_status = WaitBounded(*sleeps);
  ASSERT_TRUE(WIFSIGNALED(kill_status)) << kill_status;
  EXPECT_EQ(WTERMSIG(kill_status), SIGKILL);
}

TEST(ForkServer, ManyCopiesRunAtOnceEachWithItsOwnLog) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 8; ++i) {
    auto pid = ForkCopy({absl::StrCat(kActionVar, "=env"), absl::StrCat("COPY=", i)},
                        LogPath(absl::StrCat("many", i)));
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  for (int i = 0; i < 8; ++i) {
    const int status = WaitBounded(pids[i]);
    ASSERT_TRUE(WIFEXITED(status)) << i;
    EXPECT_EQ(WEXITSTATUS(status), 0) << i;
    EXPECT_NE(ReadAll(LogPath(absl::StrCat("many", i))).find(absl::StrCat("COPY=", i, "\n")),
              std::string::npos)
        << i;
  }
}

// As an executed copy inherits them: ignored signals stay ignored (Gloo
// writes to a dead peer's socket: with SIGPIPE ignored by the launcher, a
// survivor sees a failed write, not death by signal), and the mask stays.
TEST(ForkServer, ACopyIgnoresAndBlocksTheSignalsTheLauncherDoes) {
  struct sigaction saved_pipe;
  sigaction(SIGPIPE, nullptr, &saved_pipe);
  sigset_t saved_mask, usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, nullptr, &saved_mask);

  signal(SIGPIPE, SIG_IGN);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  auto ignoring = ForkCopy({absl::StrCat(kActionVar, "=signals")}, LogPath("ignoring"));
  signal(SIGPIPE, SIG_DFL);
  pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  auto plain = ForkCopy({absl::StrCat(kActionVar, "=signals")}, LogPath("plain"));
  sigaction(SIGPIPE, &saved_pipe, nullptr);
  pthread_sigmask(SIG_SETMASK, &saved_mask, nullptr);

  ASSERT_TRUE(ignoring.ok()) << ignoring.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(WaitBounded(*ignoring), 0);
  EXPECT_EQ(WaitBounded(*plain), 0);
  EXPECT_EQ(ReadAll(LogPath("ignoring")), "SIGPIPE ignored\nSIGUSR1 blocked\n");
  EXPECT_EQ(ReadAll(LogPath("plain")), "SIGPIPE not ignored\nSIGUSR1 not blocked\n");
}

TEST(ForkServer, AnUnwritableLogIsExit127LikeAFailedExec) {
  auto pid = ForkCopy({absl::StrCat(kActionVar, "=env")}, "/nonexistent/dir/log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = WaitBounded(*pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 127);
}

TEST(ForkServer, NoServerIsMadeWhileAnotherThreadRuns) {
  // In a copy, which runs no server: with a second thread it makes none
  // and ForkCopy is Unavailable.
  auto pid = ForkCopy({absl::StrCat(kActionVar, "=threads")}, LogPath("threads"));
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = WaitBounded(*pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << ReadAll(LogPath("threads"));
}

TEST(ForkServer, ASecondServerIsNotMade) { EXPECT_FALSE(StartForkServer()); }

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  if (knapformer::StartForkServer()) return knapformer::CopyMain();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
