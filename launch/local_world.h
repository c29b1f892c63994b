#ifndef KNAPFORMER_LAUNCH_LOCAL_WORLD_H_
#define KNAPFORMER_LAUNCH_LOCAL_WORLD_H_

// A world of N copies of this binary on one machine, on a real distributed
// engine: the launcher owns a TCPStore on 127.0.0.1 and starts the copies;
// each joins the store and a Gloo process group. The one C++ launcher of
// local ranks: train-sim, the route benchmark and the multi-process tests
// (tests/testing/gloo_world.h) run on it. (Python's is knapformer.launch.)

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/c10d_transport.h"

namespace knapformer {

struct LocalWorld {
  int rank = 0;
  int size = 0;
  c10::intrusive_ptr<c10d::Store> store;         // the launcher's
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // Gloo over every copy
  std::unique_ptr<C10dTransport> transport;      // over `group`, with Gloo subgroups
};

// True in a copy started by LaunchLocalWorld.
bool IsLocalWorker();

// In a worker: joins the launcher's store and Gloo group. `timeout` bounds
// the store and every collective.
absl::StatusOr<LocalWorld> JoinLocalWorld(std::chrono::milliseconds timeout);

// How the launcher starts its copies.
struct LocalWorldLaunch {
  std::vector<std::string> argv;  // each copy's argv[1..] (argv[0] is this binary)
  // "NAME=value" entries added to each copy's environment, beside the
  // world's own (replacing a variable of the same name).
  std::vector<std::string> set_env;
  // Variables whose entries ("NAME=value") start with one of these are not
  // passed on.
  std::vector<std::string> drop_env_prefixes;
  // Each copy's stdout and stderr go to log_paths[rank]; empty: this
  // process's.
  std::vector<std::string> log_paths;
  // Bounds the store's waits.
  std::chrono::milliseconds store_timeout = std::chrono::seconds(60);
};

// The copies of one launch, until they are waited for.
struct LaunchedWorld {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::vector<pid_t> pids;                // by rank; -1 for a copy that did not start
  std::vector<std::string> start_errors;  // by rank; empty for a copy that started
};

// Starts `size` copies of this binary (/proc/self/exe) as ranks of one
// world, on a new store. A copy that cannot start is recorded and the rest
// are still started. Copies without arguments are forked from the fork
// server where main started one (launch/fork_server.h).
LaunchedWorld LaunchLocalWorld(int size, const LocalWorldLaunch& launch);

// Waits for every copy; those still running at `deadline` are killed.
// Exit codes by rank: the exit status, 128 + signal if a signal ended it,
// -1 if killed at the deadline or never started.
std::vector<int> WaitLocalWorld(const LaunchedWorld& world, absl::Time deadline);

// The launcher: starts `size` copies of this binary with `argv`, waits for
// them (killing those still running at `timeout`), reports failed ranks on
// stderr as "<name>: rank R exited N". Returns 0, or the worst exit code (1
// for a kill or a copy that could not start).
int RunLocalWorld(const std::string& name, int size, const std::vector<std::string>& argv,
                  absl::Duration timeout);

// The rest of a main() that is its own launcher: in a worker, returns
// `worker()` (an exception is exit 1, reported on stderr as "<name>: ...");
// in the launcher, RunLocalWorld.
int RunAsLocalWorld(const std::string& name, int size, const std::vector<std::string>& argv,
                    absl::Duration timeout, const std::function<int()>& worker);

}  // namespace knapformer

#endif  // KNAPFORMER_LAUNCH_LOCAL_WORLD_H_
