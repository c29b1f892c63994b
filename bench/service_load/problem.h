#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_PROBLEM_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_PROBLEM_H_

// One group size's problem (the mixed-resolution stream over a mixed
// topology of R ranks) and what is made from it: each step's spec and Plan
// requests, and the planner core's own solve time on the same batches.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/service_load/load_client.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/topology.h"

namespace knapformer {
namespace service_load {

struct Problem {
  int64_t ranks = 0;
  std::string topology;
  DataStream stream;
  World world;
  CostModel cost;
};

// The problem at `requested` ranks, or at the nearest valid size (printing
// what was used) when the stream or the topology rejects it.
absl::StatusOr<Problem> MakeProblem(const std::vector<DataCode>& codes, int64_t requested);

// The spec of `step` of job `job_id`.
v1::StepSpec StepSpecOf(const Problem& problem, const std::string& job_id, uint64_t step);

// The planner core's median solve time on batches first..first+steps-1, in
// this process (the server idle).
absl::StatusOr<double> CoreSolveMs(const Problem& problem, int64_t first, int64_t steps);

// Every rank's Plan request of `step` into `calls`.
void BuildRequests(const Problem& problem, const std::string& job_id, uint64_t step,
                   StepCalls& calls);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_PROBLEM_H_
