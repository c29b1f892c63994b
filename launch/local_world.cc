#include "launch/local_world.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "launch/child_process.h"
#include "launch/fork_server.h"
#include "transport/gloo_group.h"

extern char** environ;

namespace knapformer {
namespace {

constexpr char kRankVar[] = "KNAPFORMER_LOCAL_RANK";
constexpr char kSizeVar[] = "KNAPFORMER_LOCAL_SIZE";
constexpr char kPortVar[] = "KNAPFORMER_LOCAL_PORT";

bool EnvInt(const char* name, int* value) {
  const char* text = std::getenv(name);
  return text != nullptr && absl::SimpleAtoi(text, value);
}

// torch 2.x asks for a libuv TCPStore by default (TCPStoreOptions::useLibUV)
// and a torch built without libuv (Debian's 2.6) throws; 1.13 has no such
// option. Found by its presence rather than a version number, so that
// every release in between is right.
template <typename Options>
auto TurnOffLibUv(Options& options, int) -> decltype(options.useLibUV = false, bool()) {
  options.useLibUV = false;
  return true;
}
template <typename Options>
bool TurnOffLibUv(Options&, long) {
  return false;
}

// A TCPStore on 127.0.0.1: torch's default server, or the one without
// libuv where this torch lacks libuv.
c10::intrusive_ptr<c10d::TCPStore> MakeLocalStore(c10d::TCPStoreOptions options) {
  try {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    if (std::string(e.what()).find("libuv") == std::string::npos || !TurnOffLibUv(options, 0)) {
      throw;
    }
  }
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

// The launcher's TCPStore: a server on 127.0.0.1, on a free port.
c10::intrusive_ptr<c10d::TCPStore> StartLocalStore(std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  return MakeLocalStore(options);
}

// The variables that make a started copy a worker of the store's world.
std::vector<std::string> LocalWorldEnv(c10d::TCPStore& store, int rank, int size) {
  return {absl::StrCat(kRankVar, "=", rank), absl::StrCat(kSizeVar, "=", size),
          absl::StrCat(kPortVar, "=", store.getPort())};
}

std::string NameOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// Starts /proc/self/exe with `argv` and its environment changed by `launch`
// and `world_env`; its output to `log_path` (empty: this process's). A copy
// without arguments comes from the fork server where one runs
// (StartForkServer), as if executed afresh but without loading the binary
// again. Unavailable (naming the reason) if it cannot.
absl::StatusOr<pid_t> SpawnSelf(const LocalWorldLaunch& launch,
                                const std::vector<std::string>& world_env,
                                const std::string& log_path) {
  std::vector<std::string> set_env = launch.set_env;
  set_env.insert(set_env.end(), world_env.begin(), world_env.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool keep = true;
    for (const std::string& prefix : launch.drop_env_prefixes) {
      if (absl::StartsWith(entry, prefix)) keep = false;
    }
    for (const std::string& set : set_env) {
      if (NameOf(set) == NameOf(entry)) keep = false;
    }
    if (keep) env.push_back(entry);
  }
  env.insert(env.end(), set_env.begin(), set_env.end());
  if (launch.argv.empty()) {
    absl::StatusOr<pid_t> copy = ForkCopy(env, log_path);
    if (copy.ok()) return copy;
  }

  std::vector<std::string> args = {"/proc/self/exe"};
  args.insert(args.end(), launch.argv.begin(), launch.argv.end());
  std::vector<char*> argv, envp;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    return absl::UnavailableError(absl::StrCat("spawn /proc/self/exe: ", std::strerror(error)));
  }
  return pid;
}

}  // namespace

bool IsLocalWorker() { return std::getenv(kRankVar) != nullptr; }

absl::StatusOr<LocalWorld> JoinLocalWorld(std::chrono::milliseconds timeout) {
  LocalWorld world;
  int port = 0;
  if (!EnvInt(kRankVar, &world.rank) || !EnvInt(kSizeVar, &world.size) ||
      !EnvInt(kPortVar, &port)) {
    return absl::FailedPreconditionError(
        absl::StrCat(kRankVar, ", ", kSizeVar, ", ", kPortVar,
                     ": not all set; start workers with RunLocalWorld"));
  }
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(port);
    store_options.isServer = false;
    store_options.timeout = timeout;
    world.store = MakeLocalStore(store_options);
    GlooGroupOptions gloo;
    gloo.hostname = "127.0.0.1";
    gloo.timeout = timeout;
    world.group = NewGlooGroup(world.store, world.rank, world.size, gloo);
    C10dTransportOptions options;
    options.new_subgroup = GlooSubgroupFactory(world.store, gloo);
    auto transport = C10dTransport::Create(world.group, options);
    if (!transport.ok()) return transport.status();
    world.transport = *std::move(transport);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("rank ", world.rank, " joining the world: ", e.what()));
  }
  return world;
}

LaunchedWorld LaunchLocalWorld(int size, const LocalWorldLaunch& launch) {
  LaunchedWorld world;
  world.store = StartLocalStore(launch.store_timeout);
  world.pids.assign(size, -1);
  world.start_errors.assign(size, "");
  for (int rank = 0; rank < size; ++rank) {
    const std::string log_path =
        rank < static_cast<int>(launch.log_paths.size()) ? launch.log_paths[rank] : "";
    absl::StatusOr<pid_t> pid =
        SpawnSelf(launch, LocalWorldEnv(*world.store, rank, size), log_path);
    if (pid.ok()) {
      world.pids[rank] = *pid;
    } else {
      world.start_errors[rank] = pid.status().ToString();
    }
  }
  return world;
}

std::vector<int> WaitLocalWorld(const LaunchedWorld& world, absl::Time deadline) {
  const std::vector<pid_t>& pids = world.pids;
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
      codes[i] = ExitCodeOf(status);
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

int RunLocalWorld(const std::string& name, int size, const std::vector<std::string>& argv,
                  absl::Duration timeout) {
  LocalWorldLaunch launch;
  launch.argv = argv;
  launch.store_timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  const LaunchedWorld world = LaunchLocalWorld(size, launch);
  for (int rank = 0; rank < size; ++rank) {
    if (world.start_errors[rank].empty()) continue;
    std::cerr << name << ": rank " << rank << " did not start: " << world.start_errors[rank]
              << "\n";
    WaitLocalWorld(world, absl::Now());  // kills those started
    return 1;
  }
  const std::vector<int> codes = WaitLocalWorld(world, absl::Now() + timeout);
  int worst = 0;
  for (int rank = 0; rank < size; ++rank) {
    if (codes[rank] == 0) continue;
    std::cerr << name << ": rank " << rank
              << (codes[rank] < 0 ? " was killed at the timeout"
                                  : " exited " + std::to_string(codes[rank]))
              << "\n";
    worst = std::max(worst, codes[rank] < 0 ? 1 : codes[rank]);
  }
  return worst;
}

int RunAsLocalWorld(const std::string& name, int size, const std::vector<std::string>& argv,
                    absl::Duration timeout, const std::function<int()>& worker) {
  if (!IsLocalWorker()) return RunLocalWorld(name, size, argv, timeout);
  try {
    return worker();
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace knapformer
