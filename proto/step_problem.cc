#include "proto/step_problem.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/plan_proto.h"

namespace knapformer {
namespace {

// A planner error as one about the request's field: "topology ..." and
// "topology: ..." become "spec.topology: ...", "world_size: ..."
// "spec.world_size: ...".
absl::Status AsSpecField(const absl::Status& status) {
  absl::string_view message = status.message();
  if (absl::ConsumePrefix(&message, "topology: ") || absl::ConsumePrefix(&message, "topology ")) {
    return absl::Status(status.code(), absl::StrCat("spec.topology: ", message));
  }
  return absl::Status(status.code(), absl::StrCat("spec.", message));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const World>> FixedWorldOf(const std::string& topology,
                                                         int32_t world_size) {
  auto parsed = Topology::Parse(topology);
  if (!parsed.ok()) return AsSpecField(parsed.status());
  auto world = World::Create(*std::move(parsed), world_size);
  if (!world.ok()) return AsSpecField(world.status());
  return std::make_shared<const World>(*std::move(world));
}

absl::StatusOr<StepProblem> StepProblemOf(const v1::StepSpec& spec,
                                          std::shared_ptr<const World> fixed_world) {
  absl::StatusOr<Machine> machine = MachineFromSpec(spec);
  if (!machine.ok()) return machine.status();
  std::string topology;
  std::optional<AutoLayout> auto_layout;
  if (AutoLayout::Matches(spec.topology())) {
    absl::StatusOr<AutoLayout> layout = AutoLayout::Parse(spec.topology());
    if (!layout.ok()) return AsSpecField(layout.status());
    absl::StatusOr<AutoShape> shape = layout->Resolve(spec.world_size(), *machine);
    if (!shape.ok()) return AsSpecField(shape.status());
    topology = layout->spec();
    auto_layout = *layout;
  } else {
    if (fixed_world == nullptr) {
      absl::StatusOr<std::shared_ptr<const World>> world =
          FixedWorldOf(spec.topology(), spec.world_size());
      if (!world.ok()) return world.status();
      fixed_world = *std::move(world);
    }
    topology = fixed_world->spec();
  }
  absl::StatusOr<CostModel> cost = CostModelFromSpec(spec);
  if (!cost.ok()) return cost.status();
  if (auto_layout.has_value() && !PricedInFlops(cost->kind())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.topology: '", topology, "' chooses bags by the FLOP cost models' "
        "communication prices; spec.cost_model ", v1::CostModel_Name(spec.cost_model()),
        " has none, give a fixed topology"));
  }
  return StepProblem{std::move(topology), spec.world_size(), std::move(fixed_world),
                     auto_layout, *machine, *cost};
}

}  // namespace knapformer
