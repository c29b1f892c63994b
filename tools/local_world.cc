#include "tools/local_world.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tools/spawn.h"
#include "transport/gloo_group.h"

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
    if (std::string(e.what()).find("libuv") == std::string::npos ||
        !TurnOffLibUv(options, 0)) {
      throw;
    }
  }
  return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> StartLocalStore(std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  return MakeLocalStore(options);
}

std::vector<std::string> LocalWorldEnv(c10d::TCPStore& store, int rank, int size) {
  return {absl::StrCat(kRankVar, "=", rank), absl::StrCat(kSizeVar, "=", size),
          absl::StrCat(kPortVar, "=", store.getPort())};
}

bool IsLocalWorker() { return std::getenv(kRankVar) != nullptr; }

absl::StatusOr<LocalWorld> JoinLocalWorld(std::chrono::milliseconds timeout) {
  LocalWorld world;
  int port = 0;
  if (!EnvInt(kRankVar, &world.rank) || !EnvInt(kSizeVar, &world.size) || !EnvInt(kPortVar, &port)) {
    return absl::FailedPreconditionError(absl::StrCat(
        kRankVar, ", ", kSizeVar, ", ", kPortVar, ": not all set; start workers with RunLocalWorld"));
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
    return absl::UnavailableError(absl::StrCat("rank ", world.rank, " joining the world: ", e.what()));
  }
  return world;
}

int RunLocalWorld(const std::string& name, int size, const std::vector<std::string>& argv,
                  absl::Duration timeout) {
  auto store = StartLocalStore(std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    SpawnOptions spawn;
    spawn.argv = argv;
    spawn.set_env = LocalWorldEnv(*store, rank, size);
    auto pid = SpawnSelf(spawn);
    if (!pid.ok()) {
      std::cerr << name << ": rank " << rank << " did not start: " << pid.status() << "\n";
      WaitAll(pids, absl::Now());  // kills those started
      return 1;
    }
    pids.push_back(*pid);
  }
  const std::vector<int> codes = WaitAll(pids, absl::Now() + timeout);
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
