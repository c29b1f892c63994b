#ifndef KNAPFORMER_PLANNER_PACKING_BOUND_H_
#define KNAPFORMER_PLANNER_PACKING_BOUND_H_

#include <cstdint>
#include <vector>

namespace knapformer {

// Lower bounds on the busiest bag when whole sequences (a sequence never
// spans bags) go into `bags` bags of `gpus` GPUs each, per GPU: no packing
// has a bag whose workload / gpus is below the returned value.
// `workloads` is sorted in descending order; `known` is a bound already
// established (the mean, the heaviest sequence), returned when nothing here
// is higher.
//
// - Pigeonhole: the k*bags + 1 heaviest sequences cannot go k to a bag, so
//   some bag holds k + 1 of them, at least the k + 1 lightest of them.
// - Martello and Toth's L2 (Discrete Applied Mathematics 28, 1990): for a
//   bag capacity C and any a in [0, C/2], the sequences over C - a each need
//   a bag of their own that nothing of at least a joins, those in
//   (C/2, C - a] too, and those in [a, C/2] fill what those leave before
//   opening more: L(a, C) = n1 + max(n2, ceil((s2 + s3) / C)). A capacity at
//   which the largest L exceeds `bags` is infeasible; bisection finds the
//   highest such capacity it meets. Every capacity below one proven
//   infeasible is infeasible too (L(a, C) only falls as C grows, and below
//   2a the count of sequences over C/2 is at least L(a, C)), so that
//   capacity is a valid bound.
// O(S log S * 48) for S sequences.
double UniformBagsLowerBound(const std::vector<double>& workloads, int32_t bags, int32_t gpus,
                             double known);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PACKING_BOUND_H_
