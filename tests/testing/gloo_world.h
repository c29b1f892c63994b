#ifndef KNAPFORMER_TESTS_TESTING_GLOO_WORLD_H_
#define KNAPFORMER_TESTS_TESTING_GLOO_WORLD_H_

// Multi-process tests on a real distributed engine: a test spawns N copies
// of its own binary (workers), which join one TCPStore on 127.0.0.1 and a
// Gloo process group, and run a named scenario. Scenarios use gtest's
// EXPECT/ASSERT macros; a worker exits 1 if any failed. The parent owns the
// store, bounds every wait, kills the workers on timeout and reports each
// worker's output when it fails.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "launch/local_world.h"

namespace knapformer {
namespace testing_util {

struct Worker : LocalWorld {
  std::map<std::string, std::string> args;  // from RunWorkers
};

using Scenario = std::function<void(Worker&)>;

// Registers scenarios by name (a static initialiser in each test file).
bool RegisterScenario(const std::string& name, Scenario scenario);

struct WorkerRun {
  std::vector<int> exit_codes;  // by rank; -1 killed on timeout
  std::string output;           // every worker's stdout+stderr, labelled
  bool ok() const;
};

// Runs `scenario` in `size` processes; `while_running` (optional) runs in
// the parent with the store (e.g. to stop a service when the workers say
// so). Every process is reaped before it returns.
WorkerRun RunWorkers(const std::string& scenario, int size,
                     const std::map<std::string, std::string>& args = {},
                     std::chrono::seconds timeout = std::chrono::seconds(180),
                     const std::function<void(c10d::Store&)>& while_running = nullptr);

// The test binary's main: a worker when spawned by RunWorkers, else gtest.
int TestMain(int argc, char** argv);

}  // namespace testing_util
}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_TESTING_GLOO_WORLD_H_
