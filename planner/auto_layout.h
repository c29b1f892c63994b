#ifndef KNAPFORMER_PLANNER_AUTO_LAYOUT_H_
#define KNAPFORMER_PLANNER_AUTO_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/plan.h"
#include "planner/step_time.h"
#include "planner/topology.h"

namespace knapformer {

// The topology "auto": every step, the planner chooses how each replica's
// GPUs form bags, instead of the user fixing one spec for the whole run.
//
// Grammar: "auto" or "auto:" key=value (':' key=value)*, keys
//   max_bag=G  the largest bag, a power of two (default 8);
//   group=T    GPUs balanced together, a whole number of nodes (default: the
//              world, which must then be a multiple of T).
// Canonical spec: "auto:max_bag=8" or "auto:max_bag=8:group=32" (no commas:
// command lines list topologies with them).
//
// A layout is a multiset of power-of-two bags, each at most max_bag and
// dividing the node (Machine::gpus_per_node, or the group when smaller),
// summing to the group. Laid out by size ascending (topology.h), such bags
// start at a multiple of their size, so none crosses a node: every bag is
// one of the aligned blocks a client prepares a communicator for.
// The bags an auto layout may use on one world: every power of two up to
// `max_bag`, in replicas of `group` ranks.
struct AutoShape {
  int32_t group = 0;
  int32_t max_bag = 1;  // the layout's max_bag, cut to what divides a node
};

struct AutoLayout {
  static constexpr int32_t kDefaultMaxBag = 8;

  int32_t max_bag = kDefaultMaxBag;
  int32_t group = 0;  // 0 = the world

  // Whether `spec` asks for auto ("auto" or "auto:..."), not whether it is valid.
  static bool Matches(absl::string_view spec);
  // InvalidArgument naming the key and its limit.
  static absl::StatusOr<AutoLayout> Parse(absl::string_view spec);
  std::string spec() const;
  // The spec naming the bags it may use on a world of `shape`: max_bag cut
  // to shape's (what divides a node, or the group). What a row is labelled.
  std::string SpecOn(const AutoShape& shape) const;

  // Its shape on `world_size` ranks of `machine`. InvalidArgument for a
  // world that is not a whole number of groups, or a group that is not a
  // whole number of nodes.
  absl::StatusOr<AutoShape> Resolve(int64_t world_size, const Machine& machine) const;
  // OK when `world` is a layout this one may choose on `machine`: replicas
  // of the group, every bag a power of two up to the largest bag (laid out
  // ascending, such bags are aligned and stay within nodes). Else
  // InvalidArgument naming the replica and the bag.
  absl::Status CheckChosen(const World& world, const Machine& machine) const;
};

// What BalanceAuto chose.
struct AutoPlan {
  Plan plan;        // plan.topology is world.spec(): the chosen layout
  World world;      // each replica's chosen topology
  PredictedStep predicted;  // == PredictStep(plan, world, ...)
  int32_t candidates = 0;   // layouts considered, over all replicas
  int32_t solved = 0;       // of those, solved (the others were ruled out)
};

// Plans one step under `layout` on `world_size` ranks: for each replica, it
// considers every homogeneous layout (g1, g2, ... up to the largest bag) and
// layouts shaped by the step's data (as many bags of each size as the
// sequences that need that size fill, the rest one-GPU bags), solves each
// with the greedy balancer and `options` (balancer.h), and keeps the one of
// least predicted step time (step_time.h; ties: the earlier layout in that
// order). A layout is not solved when it could not win against the best
// found: its lower bound (its mean load with Ulysses priced in, or what
// the longest sequence alone puts on one GPU) is not below it, or a
// packing argument proves every placement slower (placement_bound.h). So
// the result is never predicted slower than any fixed homogeneous layout
// solved with the same options, and does not depend on the order the
// layouts are solved in (the one-size layouts first).
// With options.threads > 1 (from 4096 sequences in a replica), up to that
// many candidates are solved at once; the choice is the same.
//
// Errors: InvalidArgument for a world that is not a whole number of groups,
// a group that is not a whole number of nodes, and BalanceGreedy's input
// errors; ResourceExhausted when no layout places every sequence under
// options.max_tokens_per_gpu (the first layout's error) or past the limits.
absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, const CostModel& cost,
                                     const CommPrices& prices, const BalancerInput& input,
                                     const BalancerOptions& options = BalancerOptions());

// The same for a caller done with the input's masks: they move into the
// plan instead of being copied (BalanceGreedy). `input` keeps its lengths.
absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, const CostModel& cost,
                                     const CommPrices& prices, BalancerInput&& input,
                                     const BalancerOptions& options = BalancerOptions());

// The same for lengths and masks not yet checked (BalancerInput::Check's
// errors first).
absl::StatusOr<AutoPlan> BalanceAuto(const AutoLayout& layout, int64_t world_size,
                                     const CostModel& cost, const CommPrices& prices,
                                     const RankLengths& lengths,
                                     const BalancerOptions& options = BalancerOptions(),
                                     const RankMasks* masks = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_AUTO_LAYOUT_H_
