#ifndef KNAPFORMER_PLANNER_REPLICA_PACKER_H_
#define KNAPFORMER_PLANNER_REPLICA_PACKER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "planner/attention_mask.h"
#include "planner/balancer_options.h"
#include "planner/cost_model.h"
#include "planner/replica_bags.h"
#include "planner/sequence_table.h"
#include "planner/topology.h"

namespace knapformer {
namespace internal {

// The non-empty sequences of the `group` ranks from `first_rank`,
// heaviest first: workload (priced by `cost`, under `masks`: null or
// empty, all full) descending, ties by length descending, then id
// ascending. Masks that are all full order exactly as none. O(S) (radix
// sorts). REQUIRES: the input passed CheckBalancerInput and, with masks,
// CheckRankMasks.
SortedSequences SortReplicaSequences(const CostModel& cost,
                                     const std::vector<std::vector<int64_t>>& lengths,
                                     int32_t first_rank, int32_t group,
                                     const std::vector<int32_t>& first_sequence,
                                     const RankMasks* masks);

// Phase 1 of BalanceGreedy (balancer.h) for one replica: chooses a bag for
// each of its non-empty sequences. AssignReplicaBags (replica_solve.h) runs
// the phases in this order, each on the placement the last one chose:
//   PackGreedy, TryOtherRule, TryMultifit, TryAllHome, TryLocality (with
//   options.locality), WriteBags.
// A candidate replaces the chosen placement only where the comments below
// say; every one respects the token cap. Deterministic: the same input
// gives the same bags, to the bit of every workload compared.
//
// Holds references to `first_sequence`, which must outlive it. Not
// thread-safe; one per replica and planning call.
class ReplicaPacker {
 public:
  // The replica of `topology` whose ranks start at `first_rank`, its
  // sequences as SortReplicaSequences gave them (taken over: auto passes
  // each layout a copy of one sort); first_sequence[rank] the global id of
  // each rank's first sequence (FirstSequences). `greedy`,
  // `refine_rounds`, `max_tokens_per_gpu` and `rank_speeds` are
  // BalancerOptions' (0: no refinement, no cap; empty: one speed). Every
  // workload compared per bag is its time (replica_bags.h).
  ReplicaPacker(const Topology& topology, GreedyRule greedy, int32_t refine_rounds,
                int64_t max_tokens_per_gpu, const std::vector<double>& rank_speeds,
                SortedSequences sorted, int32_t first_rank,
                const std::vector<int32_t>& first_sequence);

  ReplicaPacker(const ReplicaPacker&) = delete;
  ReplicaPacker& operator=(const ReplicaPacker&) = delete;

  // True when the replica has no non-empty sequence: there is nothing to
  // place, and no phase may run.
  bool empty() const { return table_.size() == 0; }

  // The greedy by the packer's rule (Pack with no home cap) and then
  // refinement (Refine): the first chosen placement. ResourceExhausted
  // naming the sequence the greedy found no bag with room for under the
  // token cap; nothing is chosen then, and no later phase may run.
  // REQUIRES: !empty().
  absl::Status PackGreedy();

  // Under masks or on GPUs of unequal speeds, without a token cap, in a
  // layout of several bag sizes and a replica of fewer than 4096 sequences,
  // the greedy by the other rule (GreedyRule), refined, replaces the chosen
  // placement when its maximum time is strictly lower: with coarse masked
  // workloads neither rule wins every step. REQUIRES: PackGreedy succeeded.
  void TryOtherRule();

  // Under masks or on GPUs of unequal speeds, and without a token cap,
  // MULTIFIT (multifit.h), refined, replaces the chosen placement when its
  // maximum time is strictly lower. Does nothing otherwise, when the chosen
  // placement is within kMultifitMinGap of the simple lower bound, or when
  // first-fit decreasing fails at that gain under it (one packing).
  // REQUIRES: PackGreedy succeeded.
  void TryMultifit();

  // Every sequence in its source rank's bag replaces the chosen placement
  // when its maximum per GPU is strictly lower and it respects the cap.
  // REQUIRES: PackGreedy succeeded.
  void TryAllHome();

  // The home-first packing, repaired (locality.h) where over the limit,
  // replaces the chosen placement when within `slack` (relative) of its
  // maximum per GPU, at most the all-home maximum, and surely moving fewer
  // tokens. REQUIRES: TryAllHome ran.
  void TryLocality(double slack);

  // Sets bag_of[id] to the chosen bag (replica-relative) of every non-empty
  // sequence id of the replica, and returns the chunks they make: each
  // sequence one per GPU of its bag, fewer when shorter (BuildPlan's table
  // size). REQUIRES: PackGreedy succeeded.
  int64_t WriteBags(std::vector<int32_t>& bag_of) const;

 private:
  class BagQueue;

  // Sets class_first_, class_last_, class_of_, first_usable_ and
  // last_usable_ from bags_, target_ and table_.
  void FindUsableBags();

  // Tokens per bag of a placement (-1: not placed, counts nothing).
  std::vector<int64_t> TokensOf(const std::vector<int32_t>& bags) const;
  // Whether a complete placement respects the token cap (always, without one).
  bool FitsCap(const std::vector<int32_t>& bags) const;
  // Local refinement of a packing (refine.h), in place; undone if it broke
  // the token cap. No-op with refine_rounds_ <= 0.
  void Refine(std::vector<int32_t>& bags, std::vector<double>& assigned) const;
  // Places every sequence without a bag yet (-1), heaviest first, on top of
  // what `assigned` holds. The greedy (home_cap 0): the usable bag `rule`
  // chooses. Home-first (home_cap > 0): its home bag while that is usable
  // and stays at or under home_cap per GPU, else the same. Under a cap on
  // tokens, only bags with room count: the rule's usable bag with
  // room, else its bag with room among all the sequence's bag sizes (below
  // its usable range too); false, setting unplaced_, when no bag has room
  // (`bags` and `assigned` are then partly filled).
  bool Pack(GreedyRule rule, double home_cap, std::vector<int32_t>& bags,
            std::vector<double>& assigned);
  // The largest time of a bag (0 with no bags): its workload per GPU at
  // speed 1.
  double MaxPerGpu(const std::vector<double>& assigned) const;
  // Tokens a complete placement sends to other ranks, bounded both ways: in
  // its home bag a sequence's source rank keeps floor(l/G) or ceil(l/G) of
  // its tokens, as the chunk rotation (phase 2) decides; the bound is the
  // most moved with `at_least` false, the least with it true.
  int64_t MovedTokensBound(const std::vector<int32_t>& bags, bool at_least) const;

  const std::vector<int32_t>& first_sequence_;  // for the cap's error message
  const GreedyRule greedy_;
  const int32_t refine_rounds_;
  // A hard cap on tokens per GPU (0: none): chunking spreads a bag's tokens
  // over its GPUs to within one token, so a bag of G GPUs may hold cap * G
  // tokens (TokenCapOfBag).
  const int64_t cap_;
  const int32_t group_;  // GPUs (ranks) in the replica
  const int32_t num_bags_;
  ReplicaBags bags_;  // sizes (ascending) and speeds
  // fastest_through_[b]: the highest bag speed among bags 0..b.
  std::vector<double> fastest_through_;

  // Whether any sequence has a mask other than full: masks that are all full
  // plan exactly as none.
  bool masked_ = false;
  // Whether the bags' GPUs run at unequal speeds (ReplicaBags::uneven).
  bool uneven_ = false;
  // Every per-sequence vector below and every placement is indexed by
  // position in the table's order.
  SequenceTable table_;
  double target_ = 0;  // fair time: total workload / the bags' total speed
  // The bags sequence k may use: [first_usable_[k], last_usable_[k]].
  std::vector<int32_t> first_usable_, last_usable_;
  // The bags of each size, ascending: class c is bags
  // [class_first_[c], class_last_[c]]; class_of_[b] is bag b's class.
  std::vector<int32_t> class_first_, class_last_, class_of_;

  int32_t unplaced_ = -1;        // the first item a pack could not place under the cap
  std::vector<int32_t> chosen_;  // the placement chosen so far: chosen_[k] is k's bag
  // The bags' workloads under chosen_ as PackGreedy, TryOtherRule and
  // TryMultifit leave it; TryAllHome does not update it (no later phase
  // reads it).
  std::vector<double> assigned_;
  double planned_max_ = 0;  // the largest workload per GPU under chosen_
  double home_max_ = 0;     // the same with every sequence in its home bag
};

}  // namespace internal
}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_REPLICA_PACKER_H_
