#ifndef KNAPFORMER_TOOLS_LOCAL_WORLD_H_
#define KNAPFORMER_TOOLS_LOCAL_WORLD_H_

// A world of N copies of this binary on one machine, on a real distributed
// engine: the launcher owns a TCPStore on 127.0.0.1 and starts the copies;
// each joins the store and a Gloo process group. train-sim, the route
// benchmark and the multi-process tests run on it.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/c10d_transport.h"

namespace knapformer {

struct LocalWorld {
  int rank = 0;
  int size = 0;
  c10::intrusive_ptr<c10d::Store> store;          // the launcher's
  c10::intrusive_ptr<c10d::ProcessGroup> group;  // Gloo over every copy
  std::unique_ptr<C10dTransport> transport;       // over `group`, with Gloo subgroups
};

// The launcher's TCPStore: a server on 127.0.0.1, on a free port.
c10::intrusive_ptr<c10d::TCPStore> StartLocalStore(std::chrono::milliseconds timeout);

// The variables that make a started copy a worker of the store's world.
std::vector<std::string> LocalWorldEnv(c10d::TCPStore& store, int rank, int size);

// True in a copy started with LocalWorldEnv.
bool IsLocalWorker();

// In a worker: joins the launcher's store and Gloo group. `timeout` bounds
// the store and every collective.
absl::StatusOr<LocalWorld> JoinLocalWorld(std::chrono::milliseconds timeout);

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

#endif  // KNAPFORMER_TOOLS_LOCAL_WORLD_H_
