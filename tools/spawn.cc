#include "tools/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace knapformer {
namespace {

std::string NameOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

}  // namespace

absl::StatusOr<pid_t> SpawnSelf(const SpawnOptions& options) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool keep = true;
    for (const std::string& prefix : options.drop_env_prefixes) {
      if (absl::StartsWith(entry, prefix)) keep = false;
    }
    for (const std::string& set : options.set_env) {
      if (NameOf(set) == NameOf(entry)) keep = false;
    }
    if (keep) env.push_back(entry);
  }
  env.insert(env.end(), options.set_env.begin(), options.set_env.end());

  std::vector<std::string> args = {"/proc/self/exe"};
  args.insert(args.end(), options.argv.begin(), options.argv.end());
  std::vector<char*> argv, envp;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, options.log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  const int error = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("spawn /proc/self/exe: ", std::strerror(error)));
  }
  return pid;
}

std::vector<int> WaitAll(const std::vector<pid_t>& pids, absl::Time deadline) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  size_t running = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    done[i] = pids[i] <= 0;
    running += !done[i];
  }
  while (running > 0 && absl::Now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      done[i] = true;
      --running;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    kill(pids[i], SIGKILL);
    waitpid(pids[i], nullptr, 0);
  }
  return codes;
}

}  // namespace knapformer
