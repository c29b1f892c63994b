#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_GROUP_MODE_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_GROUP_MODE_H_

// The group-mode table, after the per-rank one at the same group sizes:
// one PlanGroup call per step (PlannerClient's default), its answer
// serialized, parsed and rebuilt into one rank's plan; each part's time,
// the server's CPU against per-rank mode's, and the request and answer
// sizes.

#include "bench/service_load/flags.h"
#include "bench/service_load/per_rank.h"
#include "bench/service_load/server_child.h"

namespace knapformer {
namespace service_load {

// Prints the table's header and a row per problem of `per_rank` (the
// per-rank table's, or with --group-only the group sizes alone, with no
// per-rank figures to compare). False if any failed.
bool RunGroupModeTable(const Flags& flags, const PerRankRun& per_rank, ServerProcess& server);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_GROUP_MODE_H_
