#include "tests/testing/gloo_world.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "launch/fork_server.h"

namespace knapformer {
namespace testing_util {
namespace {

constexpr char kScenarioVar[] = "KNAPFORMER_WORKER_SCENARIO";
constexpr auto kStoreTimeout = std::chrono::seconds(60);

std::map<std::string, Scenario>& Scenarios() {
  static auto* scenarios = new std::map<std::string, Scenario>();
  return *scenarios;
}

std::string OutputDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string EncodeArgs(const std::map<std::string, std::string>& args) {
  std::string out;
  for (const auto& [key, value] : args) absl::StrAppend(&out, key, "=", value, ";");
  return out;
}

std::map<std::string, std::string> DecodeArgs(const char* text) {
  std::map<std::string, std::string> args;
  if (text == nullptr) return args;
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    args[kv.first] = kv.second;
  }
  return args;
}

int RunAsWorker(const std::string& name) {
  auto it = Scenarios().find(name);
  if (it == Scenarios().end()) {
    std::cerr << "worker: no scenario named " << name << "\n";
    return 2;
  }
  // One intra-op thread per rank, as knapformer.launch's run_world gives
  // its ranks: the ranks share the machine's cores. With torch's default
  // (a thread per core) each of N ranks runs an OpenMP team whose threads
  // spin-wait for one another on the oversubscribed cores (under ASan on
  // torch 2.6, four of these tests took 352 CPU seconds so, 312 without).
  at::set_num_threads(1);
  auto world = JoinLocalWorld(kStoreTimeout);
  if (!world.ok()) {
    std::cerr << "worker: " << world.status() << "\n";
    return 1;
  }
  Worker worker;
  static_cast<LocalWorld&>(worker) = *std::move(world);
  worker.args = DecodeArgs(std::getenv("KNAPFORMER_WORKER_ARGS"));
  try {
    it->second(worker);
  } catch (const std::exception& e) {
    std::cerr << "rank " << worker.rank << ": exception: " << e.what() << "\n";
    return 1;
  }
  return ::testing::UnitTest::GetInstance()->Failed() ? 1 : 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

bool RegisterScenario(const std::string& name, Scenario scenario) {
  Scenarios()[name] = std::move(scenario);
  return true;
}

bool WorkerRun::ok() const {
  if (exit_codes.empty()) return false;
  for (int code : exit_codes) {
    if (code != 0) return false;
  }
  return true;
}

WorkerRun RunWorkers(const std::string& scenario, int size,
                     const std::map<std::string, std::string>& args, std::chrono::seconds timeout,
                     const std::function<void(c10d::Store&)>& while_running) {
  WorkerRun run;
  LocalWorldLaunch launch;
  // The parent writes gtest's XML; the workers must not overwrite it.
  launch.drop_env_prefixes = {"XML_OUTPUT_FILE=", "GTEST_OUTPUT=", "KNAPFORMER_"};
  launch.set_env = {absl::StrCat(kScenarioVar, "=", scenario),
                    absl::StrCat("KNAPFORMER_WORKER_ARGS=", EncodeArgs(args))};
  for (int rank = 0; rank < size; ++rank) {
    launch.log_paths.push_back(
        absl::StrCat(OutputDir(), "/worker_", scenario, "_", getpid(), "_", rank, ".log"));
  }
  launch.store_timeout = kStoreTimeout;
  const LaunchedWorld world = LaunchLocalWorld(size, launch);
  for (int rank = 0; rank < size; ++rank) {
    if (world.start_errors[rank].empty()) continue;
    absl::StrAppend(&run.output, "rank ", rank, " did not start: ", world.start_errors[rank],
                    "\n");
  }

  std::thread parent_side;
  if (while_running) parent_side = std::thread([&] {
    try {
      while_running(*world.store);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "parent side of " << scenario << ": " << e.what();
    }
  });
  run.exit_codes = WaitLocalWorld(world, absl::Now() + absl::FromChrono(timeout));
  if (parent_side.joinable()) parent_side.join();
  for (int rank = 0; rank < size; ++rank) {
    absl::StrAppend(&run.output, "---- rank ", rank, " (exit ", run.exit_codes[rank],
                    run.exit_codes[rank] == -1 ? ", killed at the timeout" : "", ")\n",
                    ReadAll(launch.log_paths[rank]));
  }
  return run;
}

int TestMain(int argc, char** argv) {
  // Workers are forked from a server made here, before gtest and before any
  // thread, rather than executed afresh: under ASan a fresh copy of a test
  // linked with LibTorch costs about a CPU second before it runs a line,
  // and these tests start some two hundred. A forked worker returns here as
  // an executed one would start: the parent's flags are not its own.
  if (!IsLocalWorker() && StartForkServer()) argc = 1;
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* scenario = std::getenv(kScenarioVar)) return RunAsWorker(scenario);
  return RUN_ALL_TESTS();
}

}  // namespace testing_util
}  // namespace knapformer
