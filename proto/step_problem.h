#ifndef KNAPFORMER_PROTO_STEP_PROBLEM_H_
#define KNAPFORMER_PROTO_STEP_PROBLEM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/step_solve.h"
#include "planner/topology.h"

namespace knapformer {

// The fixed world of `topology` x `world_size`; InvalidArgument naming
// spec.topology or spec.world_size. REQUIRES: !AutoLayout::Matches(topology).
absl::StatusOr<std::shared_ptr<const World>> FixedWorldOf(const std::string& topology,
                                                         int32_t world_size);

// The problem (planner/step_solve.h) `spec` names. InvalidArgument naming the field
// (spec.topology, spec.world_size, spec.machine.<member>, spec.d_model...).
// `fixed_world`, when given, is the world of spec.topology and
// spec.world_size, already built (a cache's).
absl::StatusOr<StepProblem> StepProblemOf(
    const v1::StepSpec& spec, std::shared_ptr<const World> fixed_world = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_PROTO_STEP_PROBLEM_H_
