#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_SOAK_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_SOAK_H_

// The soak (--soak-minutes): one group stepping without pause for minutes;
// every --sample-seconds a row of the server's RSS, open fds and CPU and
// the window's step latency, then the RSS at the end against the first.

#include <cstdint>

#include "bench/service_load/load_client.h"
#include "bench/service_load/problem.h"
#include "bench/service_load/server_child.h"

namespace knapformer {
namespace service_load {

// Prints "soak: R ranks, M minutes" and the soak's table. kFailed on a
// step with failed calls; kStuck when calls are still in flight.
Outcome RunSoak(LoadClient& client, ServerProcess& server, const Problem& problem,
                int64_t minutes, int64_t sample_seconds);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_SOAK_H_
