#ifndef KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_
#define KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_

#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/sequence_table.h"
#include "planner/topology.h"

namespace knapformer {

// Whether every placement of one replica's sequences on `topology` is
// predicted (PredictReplica, step_time.h) slower than `time`: what lets
// BalanceAuto skip a candidate layout without solving it, once another
// one has been solved at `time`. `table` holds the replica's non-empty
// sequences (workload and length; any order), `fastest` its fastest GPU's
// normalized speed (1 with one speed).
//
// True only when a packing argument proves it; false says nothing. Each
// argument is about bags: a bag of G GPUs holding sequences of workloads
// w and lengths l keeps some GPU busy for at least
//   s = (sum w / fastest + U(G) * sum l) / G,
// its mean compute and Ulysses time (U the Ulysses price per token), so a
// placement faster than t puts
//   - no sequence in a bag size where its own chunk alone takes t or more
//     (so each sequence has a smallest size it may use);
//   - at most one "big" sequence in each bag, one over half of G * t;
//   - in all the bags of size G and larger together, at most their
//     G * t each of the volume of the sequences that may use no smaller
//     size (each counted at the smallest size's price);
//   - and of the big sequences whose smallest size is G, any beyond one
//     a bag of G in the larger sizes, adding at least the smallest of
//     them to those sizes' volume.
// The unmasked curve's data-shaped layouts at 65,536 GPUs
// (bench/planner_curve) are skipped by the last two; the one-size layouts
// within a few percent of the best are not, and cannot be by volume.
//
// Monotone: true for a time is true for every lower one. O(S * K) for S
// sequences and K bag sizes, most sequences screened out by one compare.
bool EveryPlacementSlower(const Topology& topology, const SequenceTable& table,
                          const CostModel& cost, const CommPrices& prices, double fastest,
                          double time);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_
