// The planner service under load: R ranks of one group over 127.0.0.1.
//
// Figures only, nothing is asserted. The server (knapformer::PlannerServer)
// runs in a child process forked before this process creates any gRPC object,
// so that its CPU time can be read from /proc/<pid>/stat on its own. The
// client plays every rank of one group with gRPC's callback API over 8
// channels (8 TCP connections), each step sending the R Plan requests of the
// paper's synthetic mixed-resolution stream and waiting for the R answers.
//
// Per R, after the warm-up steps:
//   steps/s         measured steps / their summed step latency
//   p50, p99        step latency: from just before the first request is sent
//                   to the arrival of the last answer (building the requests
//                   is not timed)
//   server CPU      the child's utime+stime over the measured steps, per step
//                   (clock-tick resolution: 1/sysconf(_SC_CLK_TCK) s in total)
//   bare ...        the same steps against a bare gRPC rendezvous in a second
//                   child (bench/bare_rendezvous.h: same RPC, replies of the
//                   same weight, no plan), measured right before the planner
//                   at each R: the floor of per-rank mode's server CPU per call
//   core solve      BalanceGreedy on the same batches in this process, median
//   client CPU      this process's CPU over the measured steps, per step
//   plan_micros     the server's own solve time as it reports it, median
//
//   bazel build -c opt //bench:service_load_bench
//   bazel-bin/bench/service_load_bench --ranks 32,256,1024,4096 --steps 100 --warmup 5
//

#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/service_load/flags.h"
#include "bench/service_load/group_mode.h"
#include "bench/service_load/load_client.h"
#include "bench/service_load/overload.h"
#include "bench/service_load/per_rank.h"
#include "bench/service_load/problem.h"
#include "bench/service_load/server_child.h"
#include "bench/service_load/settings.h"
#include "bench/service_load/soak.h"
#include "common/malloc_policy.h"
#include "planner/data_stream.h"

namespace knapformer {
namespace service_load {
namespace {

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// Calls in flight still point into this process's buffers: ends now,
// without running gRPC's destructors, after stopping the server (and the
// bare rendezvous, where it runs).
[[noreturn]] void EndStuck(ServerProcess& server, ServerProcess* bare_server) {
  std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
  if (bare_server != nullptr) {
    std::fprintf(stderr, "bare rendezvous child: %s\n", bare_server->Stop().c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    PrintUsage(argv[0]);
    return 2;
  }
  absl::StatusOr<std::vector<DataCode>> codes = ParseDataCodes(ScenarioCodes(kScenario));
  if (!codes.ok()) {
    std::fprintf(stderr, "%s: %s\n", kScenario, codes.status().ToString().c_str());
    return 2;
  }

  // Before any gRPC object exists in this process. The bare rendezvous is
  // only needed for the table.
  const bool table = !flags.overload && flags.soak_minutes == 0;
  ServerProcess server(ServerKind::kPlanner);
  if (!server.Start()) return 1;
  ServerProcess bare_server(ServerKind::kBareRendezvous);
  const bool per_rank_table = table && !flags.group_only;
  if (per_rank_table && !bare_server.Start()) return 1;

  std::printf(
      "service_load_bench: nproc %d; server pid %d on 127.0.0.1:%d (in a child "
      "process); %d channels, callback API, retries off; %s stream seed %llu, "
      "d_model %d, gamma %.2f; %lld warm-up steps per R; server CPU at 1/%ld s "
      "resolution over all measured steps\n",
      AvailableCpus(), static_cast<int>(server.pid()), server.port(), kChannels, kScenario,
      static_cast<unsigned long long>(kStreamSeed), kDModel, kGamma,
      static_cast<long long>(flags.warmup), sysconf(_SC_CLK_TCK));
  std::fflush(stdout);

  int exit_code = 0;
  {
    LoadClient client(server.port());
    if (!client.Connect()) {
      std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
      return 1;
    }
    if (!table) {  // the overload or the soak, at the first --ranks
      absl::StatusOr<Problem> problem = MakeProblem(*codes, flags.ranks[0]);
      if (!problem.ok()) {
        std::fprintf(stderr, "%s\n", problem.status().ToString().c_str());
        return 1;
      }
      const Outcome outcome =
          flags.overload
              ? RunOverload(client, server, *problem)
              : RunSoak(client, server, *problem, flags.soak_minutes, flags.sample_seconds);
      if (outcome == Outcome::kStuck) EndStuck(server, nullptr);
      if (outcome != Outcome::kOk) exit_code = 1;
    } else if (flags.group_only) {
      PerRankRun problems;  // the group sizes alone: no per-rank figures
      for (const int64_t ranks : flags.ranks) {
        absl::StatusOr<Problem> problem = MakeProblem(*codes, ranks);
        if (!problem.ok()) {
          std::fprintf(stderr, "%s\n", problem.status().ToString().c_str());
          return 1;
        }
        problems.problems.push_back(*std::move(problem));
      }
      if (!RunGroupModeTable(flags, problems, server)) exit_code = 1;
    } else {
      LoadClient bare_client(bare_server.port());
      if (!bare_client.Connect()) {
        std::fprintf(stderr, "bare rendezvous child: %s\n", bare_server.Stop().c_str());
        return 1;
      }
      PerRankRun per_rank;
      const Outcome outcome = RunPerRankTable(flags, *codes, client, server, bare_client,
                                              bare_server, &per_rank);
      if (outcome == Outcome::kStuck) EndStuck(server, &bare_server);
      if (outcome != Outcome::kOk) exit_code = 1;
      if (!RunGroupModeTable(flags, per_rank, server)) exit_code = 1;
    }
  }  // every channel is closed before the server is asked to stop

  const std::string how = server.Stop();
  if (how != "exited with status 0") {
    std::fprintf(stderr, "server child %s\n", how.c_str());
    exit_code = 1;
  }
  if (per_rank_table) {
    const std::string bare_how = bare_server.Stop();
    if (bare_how != "exited with status 0") {
      std::fprintf(stderr, "bare rendezvous child %s\n", bare_how.c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace service_load
}  // namespace knapformer

int main(int argc, char** argv) {
  // As `knapformer serve` does: Debian's abseil checks every lock for
  // deadlock cycles (gRPC's too), ~5% of the server's CPU; and malloc keeps
  // freed memory for the next plan (common/malloc_policy.h). The server child
  // is forked from here and inherits both; so does the core solve measured
  // in this process.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status retained = knapformer::RetainFreedMemory(); !retained.ok()) {
    std::fprintf(stderr, "%s\n", std::string(retained.message()).c_str());
    return 1;
  }
  return knapformer::service_load::Main(argc, argv);
}
