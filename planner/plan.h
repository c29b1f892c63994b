#ifndef KNAPFORMER_PLANNER_PLAN_H_
#define KNAPFORMER_PLANNER_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner/attention_mask.h"

namespace knapformer {

// One contiguous piece [offset, offset+length) of sequence `seq_index` of
// `src_rank` (the index in that rank's own list of sequences), computed on
// `dst_rank`. All ranks are global.
struct Chunk {
  int32_t src_rank = 0;
  int32_t seq_index = 0;
  int64_t offset = 0;
  int64_t length = 0;
  int32_t dst_rank = 0;
};

// Where one sequence went. Sequences are numbered globally rank-major: the
// sequences of rank 0 first, in list order, then rank 1, ...
struct PlacedSequence {
  int32_t src_rank = 0;
  int32_t seq_index = 0;
  int64_t length = 0;
  int32_t bag = -1;          // global bag (replica * num_bags + bag id); -1 if length == 0
  int32_t first_chunk = 0;   // its chunks are chunks[first_chunk, first_chunk + num_chunks)
  int32_t num_chunks = 0;    // 0 for an empty sequence
};

// One item of a rank's all-to-all. `seq_index` and `offset` always refer to the
// sequence as it is packed on its *source* rank.
struct Transfer {
  int32_t peer = 0;  // the destination for a send, the source for a receive
  int32_t seq_index = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

// One rank's side of one all-to-all. Sends are in send-buffer order (peer
// ascending, then seq_index); receives are in receive-buffer order (peer
// ascending, then seq_index), which is also the order the rank computes in.
struct Route {
  std::vector<Transfer> sends;
  std::vector<Transfer> recvs;
};

// moved_tokens * token_bytes, saturating at INT64_MAX; 0 when token_bytes
// <= 0 (unknown).
int64_t MovedBytes(int64_t moved_tokens, int64_t token_bytes);

// The route that undoes `forward`: each rank sends every received chunk back to
// its source, which puts it back at (seq_index, offset).
Route ReverseRoute(const Route& forward);

// What a rank of a multi-GPU bag needs for Ulysses attention.
struct UlyssesSequence {
  int32_t src_rank = 0;
  int32_t seq_index = 0;
  int64_t length = 0;                  // the full sequence
  std::vector<int64_t> chunk_lengths;  // tokens on each GPU of the bag, by position
};

struct UlyssesBag {
  int32_t first_rank = 0;  // global rank of the bag's position 0
  int32_t gpus = 1;        // ranks first_rank .. first_rank + gpus - 1
  int32_t position = 0;    // this rank's position in the bag
  // The bag's sequences in compute order ((src_rank, seq_index) ascending).
  // Empty for a single-GPU bag, where attention needs no exchange.
  std::vector<UlyssesSequence> sequences;
};

// Everything one rank needs for one step: O(its chunks + its bag's sequences),
// not O(world).
struct RankPlan {
  int32_t rank = 0;
  int32_t world_size = 0;
  Route route;  // forward; ReverseRoute(route) is the way back
  // Lengths of the chunks this rank computes on, in compute order (== the
  // lengths of route.recvs). Varlen attention in a single-GPU bag uses these.
  std::vector<int64_t> compute_chunk_lengths;
  UlyssesBag ulysses;
  double workload_before = 0;  // cost-model workload without balancing
  double workload_after = 0;   // with this plan
  // Empty unless the plan was made with attention masks: then the mask of
  // each sequence attention sees on this rank, in the order it sees them
  // (PreAttn's output order: the receives in a single-GPU bag, the Ulysses
  // sequences in a multi-GPU one), so that the trainer can build its
  // attention kernel's mask.
  std::vector<AttentionMask> attention_masks;
};

// The plan of a whole world for one step. Deterministic: the same input gives
// the same plan, field for field.
struct Plan {
  int32_t world_size = 0;
  std::string topology;  // World::spec(): the canonical spec, or per replica joined by ';'
  int32_t bags_per_replica = 0;  // 0 when the replicas' topologies differ
  std::vector<PlacedSequence> sequences;  // rank-major, see PlacedSequence
  std::vector<Chunk> chunks;              // ordered by (src_rank, seq_index, offset)
  std::vector<double> workload_before;    // per rank: its own sequences, unmoved
  std::vector<double> workload_after;     // per rank: under this plan
  // The attention masks the plan was made with (masks[rank][i]); empty when
  // every sequence attends fully.
  RankMasks masks;

  // Indexes for slicing; built by the balancer.
  std::vector<int32_t> rank_first_sequence;  // size world+1, into sequences
  std::vector<int32_t> bag_sequences;        // global sequence ids by (bag, id)
  std::vector<int32_t> bag_begin;            // size bags+1, into bag_sequences
  std::vector<int32_t> bag_first_rank;       // per global bag
  std::vector<int32_t> bag_gpus;             // per global bag

  // Fills bag_begin and bag_sequences from sequences[].bag, each bag's
  // sequences in id ((src_rank, seq_index)) order. REQUIRES: bag_first_rank
  // has one entry per global bag and every bag is in [-1, that size).
  void IndexBags();

  // The slice of `rank`. REQUIRES: 0 <= rank < world_size.
  RankPlan Slice(int32_t rank) const;

  // `masks` as the functions that price attention take them: null when
  // every sequence attends fully (as BalancerInput::masks()).
  const RankMasks* MasksOrNull() const { return masks.empty() ? nullptr : &masks; }

  // Tokens that leave their source rank (each is moved twice per step: route
  // and reverse).
  int64_t MovedTokens() const;
  int64_t TotalTokens() const;
  // Tokens each rank computes on after routing, by rank.
  std::vector<int64_t> TokensPerRank() const;
  // MovedTokens() * token_bytes (the bytes one token occupies in the
  // route's all-to-all), saturating at INT64_MAX; 0 when token_bytes <= 0.
  int64_t MovedBytes(int64_t token_bytes) const;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_PLAN_H_
