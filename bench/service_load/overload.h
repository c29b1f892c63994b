#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_OVERLOAD_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_OVERLOAD_H_

// The overload (--overload): one good group steps before, during and after
// a flood of stray Plan requests, ten times the server's pending-step, job
// and per-job limits; the good group's latency and failures, the server's
// RSS and fds per phase, and the flood's answers by code.

#include "bench/service_load/load_client.h"
#include "bench/service_load/problem.h"
#include "bench/service_load/server_child.h"

namespace knapformer {
namespace service_load {

// Prints "overload: R ranks" and the overload's table. kFailed if some
// stray request was never answered; kStuck when calls are still in flight.
Outcome RunOverload(LoadClient& client, ServerProcess& server, const Problem& problem);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_OVERLOAD_H_
