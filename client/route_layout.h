#ifndef KNAPFORMER_CLIENT_ROUTE_LAYOUT_H_
#define KNAPFORMER_CLIENT_ROUTE_LAYOUT_H_

// What one rank moves in a step, derived from its slice of the plan and
// checked: a plan from the service is data from the network, and a wrong
// one must be an error here, not rows sent to the wrong rank. No torch, so
// plain unit tests cover every check.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"

namespace knapformer {

struct RouteLayout {
  int64_t input_rows = 0;
  // Route, per world rank: rows this rank sends each, and receives from each.
  std::vector<int64_t> send_rows, recv_rows;
  // The input row of each send-buffer row (peers ascending, then the plan's
  // order): a permutation of the input.
  std::vector<int64_t> send_index;
  std::vector<int64_t> routed_lengths;  // the chunks this rank computes on
  int64_t routed_rows = 0;
  // Ulysses, per bag position; empty in a single-GPU bag.
  std::vector<int64_t> ulysses_send_rows, ulysses_recv_rows;
  std::vector<int64_t> attention_lengths;
  int64_t attention_rows = 0;
};

// Internal (naming the rank and the problem) unless the plan's sends are a
// permutation of `lengths`' tokens in ascending peer order, its receives
// ascend and match its chunk lengths, and its bag is the one this rank is
// in (`bag_gpus` from `bag_first_rank`) with one chunk length per position.
// Every count is checked against overflow, and nothing is allocated in
// proportion to what the peers are claimed to send (a hostile plan may
// claim anything): that waits for AttentionIndex.
absl::StatusOr<RouteLayout> DeriveRouteLayout(const RankPlan& plan,
                                              const std::vector<int64_t>& lengths, int rank,
                                              int world_size, int bag_gpus, int bag_first_rank);

// The received row of each attention row (whole sequences, their chunks in
// position order); empty in a single-GPU bag. O(attention rows).
// REQUIRES: `ulysses_recv_rows` is the RouteLayout derived from the plan
// whose bag is `bag`, and the bag's peers have confirmed it (their send
// counts), so that its size is backed by tokens that exist.
std::vector<int64_t> AttentionIndex(const std::vector<int64_t>& ulysses_recv_rows,
                                    const UlyssesBag& bag);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_ROUTE_LAYOUT_H_
