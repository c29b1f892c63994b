#ifndef KNAPFORMER_TOOLS_SPAWN_H_
#define KNAPFORMER_TOOLS_SPAWN_H_

// Local multi-process runs (train-sim, multi-process tests): start copies of
// this binary and reap them all within a deadline.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace knapformer {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[1..] (argv[0] is the binary)
  // "NAME=value" entries added to this process's environment (replacing a
  // variable of the same name).
  std::vector<std::string> set_env;
  // Variables whose names start with one of these are not passed on.
  std::vector<std::string> drop_env_prefixes;
  // stdout and stderr go to this file; empty = this process's.
  std::string log_path;
};

// Starts /proc/self/exe. Unavailable (naming the reason) if it cannot.
absl::StatusOr<pid_t> SpawnSelf(const SpawnOptions& options);

// Waits for every process; those still running at `deadline` are killed.
// Exit codes by index: the exit status, 128 + signal if a signal ended it,
// -1 if killed at the deadline.
std::vector<int> WaitAll(const std::vector<pid_t>& pids, absl::Time deadline);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_SPAWN_H_
