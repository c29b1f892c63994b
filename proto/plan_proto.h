#ifndef KNAPFORMER_PROTO_PLAN_PROTO_H_
#define KNAPFORMER_PROTO_PLAN_PROTO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "knapformer/v1/planner.pb.h"
#include "absl/status/statusor.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/plan.h"

namespace knapformer {

// Conversions between the planner core's plan and the v1 API messages.

// InvalidArgument naming spec.cost_model for a value this build does not know.
absl::StatusOr<CostKind> CostKindFromProto(int value);
v1::CostModel CostKindToProto(CostKind kind);

// A measured attention table to and from its message; InvalidArgument
// naming `field` (field.pairs[i] ...) for one that is not a valid table.
void MeasuredAttentionToProto(const MeasuredAttention& table, v1::MeasuredAttention* out);
absl::StatusOr<MeasuredAttention> MeasuredAttentionFromProto(const v1::MeasuredAttention& table,
                                                             const std::string& field);

// The cost model a step spec names; InvalidArgument naming the spec field
// (spec.cost_model, spec.d_model, spec.gamma).
absl::StatusOr<CostModel> CostModelFromSpec(const v1::StepSpec& spec);

// The machine a step spec names, its unset (0) fields the defaults;
// InvalidArgument naming the field ("spec.machine.gpus_per_node: ...").
absl::StatusOr<Machine> MachineFromSpec(const v1::StepSpec& spec);
// Every field set, so that the message compares equal to a spec that left
// defaults unset only after MachineFromSpec.
void MachineToProto(const Machine& machine, v1::Machine* out);

// InvalidArgument naming spec.locality for a value this build does not know.
absl::Status CheckLocality(const v1::StepSpec& spec);

// `base` with the spec's per-step options (the token cap, locality unless
// the spec leaves it to the planner). REQUIRES: CheckLocality(spec) is OK.
BalancerOptions BalancerOptionsForSpec(BalancerOptions base, const v1::StepSpec& spec);

// `plan`'s balance figures and layout; `token_bytes` prices the moved
// tokens and `plan_micros` is the time spent solving.
v1::Balance BalanceToProto(const Plan& plan, int64_t token_bytes, int64_t plan_micros);

void RankPlanToProto(const RankPlan& rank_plan, v1::RankPlan* out);

void ChunksToProto(const Plan& plan, v1::Chunks* out);

// The inverse of RankPlanToProto, for clients and tests. The message comes
// from the network: Internal naming the field when its columns (peer,
// seq_index, offset, length) differ in length, or a Ulysses sequence has
// more chunk lengths than the world has ranks. What the values mean is
// checked by the client's route layout (client/route_layout.h).
absl::StatusOr<RankPlan> RankPlanFromProto(const v1::RankPlan& proto, int32_t world_size);

// The inverse of ChunksToProto: Internal when the five columns differ in
// length. What the values mean is checked by PlanFromChunks.
absl::StatusOr<std::vector<Chunk>> ChunksFromProto(const v1::Chunks& proto);

}  // namespace knapformer

#endif  // KNAPFORMER_PROTO_PLAN_PROTO_H_
