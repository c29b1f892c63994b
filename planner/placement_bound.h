#ifndef KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_
#define KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_

#include <cstdint>

#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/sequence_table.h"
#include "planner/topology.h"

namespace knapformer {

// What a sequence of `length` tokens and `attention` puts on one GPU of a
// bag of `gpus` at least, alone: its largest chunk's linear work and its
// share of the attention at the speed `fastest`, and the chunk's Ulysses
// time at `ulysses_price` a token. A bound on any placement's step that
// puts it in such a bag (BalanceAuto's bounds, and the argument below).
inline double ChunkAloneTime(const CostModel& cost, int64_t length, double attention,
                             int32_t gpus, double ulysses_price, double fastest) {
  const int64_t chunk = (length + gpus - 1) / gpus;
  return (cost.Linear(chunk) + attention / gpus) / fastest +
         ulysses_price * static_cast<double>(chunk);
}

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
//   - at most one "big" sequence in each bag, one whose own
//     w / fastest + U(G) * l is over half of G * t;
//   - in all the bags of size G and larger together, at most their
//     G * t each of the volume of the sequences that may use no smaller
//     size (each counted at the smallest size's price);
//   - and of the big sequences whose smallest size is G, any beyond one
//     a bag of G in the larger sizes, adding at least the smallest of
//     them to those sizes' volume.
// It does not see the route (a GPU's tokens to and from other ranks),
// which is what sets the one-size layouts a few percent apart on the data
// of bench/planner_curve: those are still solved.
//
// Monotone: true for a time is true for every lower one. O(S * K) for S
// sequences and K bag sizes, most sequences screened out by one compare.
bool EveryPlacementSlower(const Topology& topology, const SequenceTable& table,
                          const CostModel& cost, const CommPrices& prices, double fastest,
                          double time);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLACEMENT_BOUND_H_
