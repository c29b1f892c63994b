#include "tests/testing/gloo_world.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
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
#include "gtest/gtest.h"

extern char** environ;

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

  // The workers' environment: ours, minus gtest's XML output (the parent
  // writes it), plus the worker variables.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view var(*e);
    if (absl::StartsWith(var, "XML_OUTPUT_FILE=") || absl::StartsWith(var, "GTEST_OUTPUT=") ||
        absl::StartsWith(var, "KNAPFORMER_WORKER_")) {
      continue;
    }
    env.emplace_back(*e);
  }
  env.push_back(absl::StrCat(kScenarioVar, "=", scenario));
  env.push_back(absl::StrCat("KNAPFORMER_WORKER_SIZE=", size));
  env.push_back(absl::StrCat("KNAPFORMER_WORKER_PORT=", store->getPort()));
  env.push_back(absl::StrCat("KNAPFORMER_WORKER_ARGS=", EncodeArgs(args)));

  std::vector<pid_t> pids(size, -1);
  std::vector<std::string> logs(size);
  for (int rank = 0; rank < size; ++rank) {
    std::vector<std::string> my_env = env;
    my_env.push_back(absl::StrCat("KNAPFORMER_WORKER_RANK=", rank));
    std::vector<char*> envp;
    for (std::string& var : my_env) envp.push_back(var.data());
    envp.push_back(nullptr);
    logs[rank] = absl::StrCat(OutputDir(), "/worker_", scenario, "_", getpid(), "_", rank, ".log");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, logs[rank].c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    if (posix_spawn(&pids[rank], "/proc/self/exe", &actions, nullptr, argv, envp.data()) != 0) {
      pids[rank] = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
  }

  std::thread parent_side;
  if (while_running) parent_side = std::thread([&] {
    try {
      while_running(*store);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "parent side of " << scenario << ": " << e.what();
    }
  });

  run.exit_codes.assign(size, -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int running = 0;
  for (pid_t pid : pids) running += pid > 0;
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int rank = 0; rank < size; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        run.exit_codes[rank] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[rank] = -1;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int rank = 0; rank < size; ++rank) {  // past the deadline
    if (pids[rank] <= 0) continue;
    kill(pids[rank], SIGKILL);
    waitpid(pids[rank], nullptr, 0);
  }
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
