#ifndef KNAPFORMER_SERVER_REQUEST_CHECK_H_
#define KNAPFORMER_SERVER_REQUEST_CHECK_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/balancer_input.h"
#include "planner/topology.h"
#include "proto/step_problem.h"
#include "server/service_limits.h"

namespace knapformer {

// A StepSpec that passed every check, with its parsed planning problem.
using CheckedSpec = StepProblem;

// Fixed worlds by (topology, world_size), so that the R requests of a step
// parse the topology once instead of R times (O(R^2) per step). Bounded: it
// starts over when `capacity` specs are held. Thread-safe.
class WorldCache {
 public:
  explicit WorldCache(size_t capacity = 256) : capacity_(capacity) {}
  // The world of `topology` x `world_size`, or InvalidArgument naming
  // spec.topology / spec.world_size. REQUIRES: not an auto layout.
  absl::StatusOr<std::shared_ptr<const World>> Get(const std::string& topology,
                                                   int32_t world_size);

 private:
  const size_t capacity_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, int32_t>, std::shared_ptr<const World>> worlds_
      ABSL_GUARDED_BY(mu_);
};

// Checks the fields every rank must agree on. InvalidArgument naming the
// field ("spec.topology: ...") for malformed values; ResourceExhausted for
// world_size over limits.max_world_size. `cache` may be null.
absl::StatusOr<CheckedSpec> CheckStepSpec(const v1::StepSpec& spec, const ServiceLimits& limits,
                                          WorldCache* cache = nullptr);

// CheckStepSpec plus the rank's range: the step and the rank a Plan
// request speaks for.
absl::StatusOr<CheckedSpec> CheckPlanRequestRank(const v1::PlanRequest& request,
                                                 const ServiceLimits& limits,
                                                 WorldCache* cache = nullptr);

// What a Plan request gives of its own rank: its sequence lengths, their
// masks and its timing. InvalidArgument naming the field, or
// ResourceExhausted past max_sequences_per_rank. A request that
// passes CheckPlanRequestRank but not this is its rank's refusal of the
// step (Rendezvous::Withdraw).
absl::Status CheckRankInput(const v1::PlanRequest& request, const ServiceLimits& limits);

// CheckPlanRequestRank, then CheckRankInput.
absl::StatusOr<CheckedSpec> CheckPlanRequest(const v1::PlanRequest& request,
                                             const ServiceLimits& limits,
                                             WorldCache* cache = nullptr);

// A group request as the solve takes it: its spec, and every rank's lengths
// and masks checked once.
struct CheckedGroupRequest {
  CheckedSpec spec;
  BalancerInput input;
  std::vector<double> rank_speeds;  // PlanGroupRequest.rank_speeds, checked
};

// CheckStepSpec plus one entry per rank, every length, timing and speed
// (CheckRankSpeeds, naming rank_speeds), then every
// mask and the step's input against `balancer_limits`
// (BalancerInputFromProto, naming ranks[r].attention_masks).
absl::StatusOr<CheckedGroupRequest> CheckPlanGroupRequest(
    const v1::PlanGroupRequest& request, const ServiceLimits& limits,
    const BalancerLimits& balancer_limits = BalancerLimits(), WorldCache* cache = nullptr);

// InvalidArgument unless `job_id` is 1-256 characters of [A-Za-z0-9._:/-],
// not ending in '/' (which names a prefix: job_auth.h).
absl::Status CheckJobId(const std::string& job_id);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_REQUEST_CHECK_H_
