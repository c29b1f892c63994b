#ifndef KNAPFORMER_PLANNER_BALANCER_OPTIONS_H_
#define KNAPFORMER_PLANNER_BALANCER_OPTIONS_H_

// What the balancers take besides the world and the cost model: the ranks'
// lengths, the input limits and the options. Apart from balancer.h so that
// its phases (replica_solve.h) need not include the balancer built on them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace knapformer {

class ChunkTableCache;  // chunk_table_cache.h

// Sequence lengths (tokens) per global rank: lengths[rank][seq_index].
using RankLengths = std::vector<std::vector<int64_t>>;

// Input limits. Every one has a precise InvalidArgument / ResourceExhausted
// error naming it.
struct BalancerLimits {
  int64_t max_sequences = int64_t{1} << 24;  // over the whole world
  int64_t max_chunks = int64_t{1} << 26;     // over the whole world (memory bound)
};

// Which bag the greedy gives each sequence, heaviest first, among the bags
// it may use (a bag of at most its length in GPUs, with room under a cap).
enum class GreedyRule {
  // The bag where the sequence ends first: the least occupied bag of each
  // size (ties to the lowest id), then of those the least time with the
  // sequence (ties to the smaller size). Across sizes the least occupied
  // bag is not where a sequence ends soonest: a one-GPU bag at half the
  // fair share given 0.7 of it ends at 1.2, a bag of 8 at 0.55 at 0.64.
  kEarliestFinish,
  // The paper's: the least occupied bag of any size (ties to the lowest id).
  kLeastOccupied,
};
// In a layout of one size the two rules choose the same bag.

// "earliest-finish" or "least-occupied"; otherwise InvalidArgument naming
// `field` and the choices.
absl::StatusOr<GreedyRule> ParseGreedyRule(const std::string& name, const std::string& field);
const char* GreedyRuleName(GreedyRule rule);

struct BalancerOptions {
  BalancerLimits limits;
  GreedyRule greedy = GreedyRule::kEarliestFinish;
  // After the greedy bag assignment, up to this many rounds of local
  // refinement (see refine.h): move or swap a sequence between the most and
  // the least loaded bag while that lowers the larger of the two. Never makes
  // max/mean worse. 0, with `greedy` kLeastOccupied and `locality` off,
  // gives the paper's greedy plan exactly (still subject to the guard
  // against doing worse than no balancing, below).
  int32_t refine_rounds = 256;
  // Locality-aware placement after the above: a home-first packing (a
  // sequence stays in its source rank's bag while that bag stays under the
  // balanced plan's maximum) repaired down to a per-GPU maximum within
  // `locality_slack` (relative) of the balanced plan's (locality.h), taken
  // when it moves fewer tokens. Off = the balanced plan as is.
  bool locality = true;
  double locality_slack = 0.0005;
  // A hard limit on the tokens any GPU computes on after routing (memory);
  // 0 = none. A bag of G GPUs may hold G times it. Every placement
  // considered respects it: the greedy only takes bags with room (see
  // below), refinement is undone if it broke it, the guard and the locality
  // candidate are only taken when they respect it. When the greedy finds no
  // bag with room for a sequence, ResourceExhausted names the sequence, its
  // rank and tokens, and the cap (the greedy is not exhaustive: a refusal
  // means it found no placement, not that none exists).
  int64_t max_tokens_per_gpu = 0;
  // Relative compute speed per global rank (rank_speeds.h); empty: every
  // rank at one speed. With speeds every phase balances time, a bag's
  // workload over its speed (replica_bags.h), instead of workload: a rank
  // at 0.6 gets about 0.6 of a share. The balancers refuse speeds that fail
  // CheckRankSpeeds.
  std::vector<double> rank_speeds;
  // Threads the solver may use, the caller's included, for work that is
  // independent: a world's replicas, and the candidate layouts of auto
  // (auto_layout.h). The plan is the same for any count, bit for bit.
  // In [1, kMaxThreads]; the balancers refuse others naming the field.
  int32_t threads = 1;
  static constexpr int32_t kMaxThreads = 256;
  // Where a plan takes its chunk table from, for its owner to give back
  // once done with the plan (chunk_table_cache.h); null: every plan
  // allocates its own. Not owned; it must outlive the call.
  ChunkTableCache* chunk_tables = nullptr;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_BALANCER_OPTIONS_H_
