#ifndef KNAPFORMER_SERVER_REQUEST_CHECK_H_
#define KNAPFORMER_SERVER_REQUEST_CHECK_H_

#include "absl/status/statusor.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/cost_model.h"
#include "planner/topology.h"
#include "server/service_limits.h"

namespace knapformer {

// A StepSpec that passed every check, with its parsed planning problem.
struct CheckedSpec {
  World world;
  CostModel cost;
};

// Checks the fields every rank must agree on. InvalidArgument naming the
// field ("spec.topology: ...") for malformed values; ResourceExhausted for
// world_size over limits.max_world_size.
absl::StatusOr<CheckedSpec> CheckStepSpec(const v1::StepSpec& spec, const ServiceLimits& limits);

// CheckStepSpec plus the rank and its sequence lengths.
absl::StatusOr<CheckedSpec> CheckPlanRequest(const v1::PlanRequest& request,
                                             const ServiceLimits& limits);

// CheckStepSpec plus one entry per rank and every length.
absl::StatusOr<CheckedSpec> CheckPlanGroupRequest(const v1::PlanGroupRequest& request,
                                                  const ServiceLimits& limits);

// InvalidArgument unless `job_id` is 1-128 characters of [A-Za-z0-9._:/-].
absl::Status CheckJobId(const std::string& job_id);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_REQUEST_CHECK_H_
