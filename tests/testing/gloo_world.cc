#include "tests/testing/gloo_world.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tools/spawn.h"

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

int EnvInt(const char* name) {
  int value = -1;
  const char* text = std::getenv(name);
  if (text == nullptr || !absl::SimpleAtoi(text, &value)) {
    std::cerr << "worker: " << name << " is not set\n";
    std::exit(2);
  }
  return value;
}

int RunAsWorker(const std::string& name) {
  auto it = Scenarios().find(name);
  if (it == Scenarios().end()) {
    std::cerr << "worker: no scenario named " << name << "\n";
    return 2;
  }
  Worker worker;
  worker.rank = EnvInt("KNAPFORMER_WORKER_RANK");
  worker.size = EnvInt("KNAPFORMER_WORKER_SIZE");
  worker.args = DecodeArgs(std::getenv("KNAPFORMER_WORKER_ARGS"));
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(EnvInt("KNAPFORMER_WORKER_PORT"));
    store_options.isServer = false;
    store_options.timeout = kStoreTimeout;
    worker.store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
    GlooGroupOptions gloo;
    gloo.hostname = "127.0.0.1";
    gloo.timeout = std::chrono::seconds(60);
    worker.group = NewGlooGroup(worker.store, worker.rank, worker.size, gloo);
    C10dTransportOptions options;
    options.new_subgroup = GlooSubgroupFactory(worker.store, gloo);
    auto transport = C10dTransport::Create(worker.group, options);
    if (!transport.ok()) {
      std::cerr << "worker: " << transport.status() << "\n";
      return 1;
    }
    worker.transport = *std::move(transport);
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
  c10d::TCPStoreOptions store_options;
  store_options.port = 0;
  store_options.isServer = true;
  store_options.waitWorkers = false;
  store_options.timeout = kStoreTimeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);

  std::vector<pid_t> pids(size, -1);
  std::vector<std::string> logs(size);
  for (int rank = 0; rank < size; ++rank) {
    SpawnOptions spawn;
    // The parent writes gtest's XML; the workers must not overwrite it.
    spawn.drop_env_prefixes = {"XML_OUTPUT_FILE=", "GTEST_OUTPUT=", "KNAPFORMER_WORKER_"};
    spawn.set_env = {absl::StrCat(kScenarioVar, "=", scenario),
                     absl::StrCat("KNAPFORMER_WORKER_RANK=", rank),
                     absl::StrCat("KNAPFORMER_WORKER_SIZE=", size),
                     absl::StrCat("KNAPFORMER_WORKER_PORT=", store->getPort()),
                     absl::StrCat("KNAPFORMER_WORKER_ARGS=", EncodeArgs(args))};
    logs[rank] = absl::StrCat(OutputDir(), "/worker_", scenario, "_", getpid(), "_", rank, ".log");
    spawn.log_path = logs[rank];
    auto pid = SpawnSelf(spawn);
    if (pid.ok()) {
      pids[rank] = *pid;
    } else {
      absl::StrAppend(&run.output, "rank ", rank, " did not start: ", pid.status().ToString(), "\n");
    }
  }

  std::thread parent_side;
  if (while_running) parent_side = std::thread([&] {
    try {
      while_running(*store);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "parent side of " << scenario << ": " << e.what();
    }
  });
  run.exit_codes = WaitAll(pids, absl::Now() + absl::FromChrono(timeout));
  if (parent_side.joinable()) parent_side.join();
  for (int rank = 0; rank < size; ++rank) {
    absl::StrAppend(&run.output, "---- rank ", rank, " (exit ", run.exit_codes[rank],
                    run.exit_codes[rank] == -1 ? ", killed at the timeout" : "", ")\n",
                    ReadAll(logs[rank]));
  }
  return run;
}

int TestMain(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (const char* scenario = std::getenv(kScenarioVar)) return RunAsWorker(scenario);
  return RUN_ALL_TESTS();
}

}  // namespace testing_util
}  // namespace knapformer
