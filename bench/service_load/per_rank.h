#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_PER_RANK_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_PER_RANK_H_

// The per-rank table (the benchmark's default, with group_mode.h's after
// it): at each --ranks, R Plan calls per step against the bare rendezvous
// and then against the planner; steps/s, step latency, server and client
// CPU per step, the planner core's solve time and the wire's weight.

#include <cstdint>
#include <map>
#include <vector>

#include "bench/service_load/flags.h"
#include "bench/service_load/load_client.h"
#include "bench/service_load/problem.h"
#include "bench/service_load/server_child.h"
#include "planner/data_stream.h"

namespace knapformer {
namespace service_load {

// What the per-rank table leaves to the group-mode table.
struct PerRankRun {
  std::vector<Problem> problems;                  // one per group size measured
  std::map<int64_t, double> server_cpu_per_step;  // by ranks: the planner's, ms
};

// Prints the table's header and a row per --ranks. kFailed if any group
// size failed (the rest are still measured, unless the server ended);
// kStuck at once, after that size's row, when calls are still in flight.
Outcome RunPerRankTable(const Flags& flags, const std::vector<DataCode>& codes,
                        LoadClient& client, ServerProcess& server, LoadClient& bare_client,
                        ServerProcess& bare_server, PerRankRun* run);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_PER_RANK_H_
