#include "planner/plan_from_chunks.h"

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "planner/replica_solve.h"
#include "planner/validate.h"

namespace knapformer {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InternalError(absl::StrCat("chunk table: ", what));
}

}  // namespace

absl::StatusOr<Plan> PlanFromChunks(const World& world, const CostModel& cost,
                                    const RankLengths& lengths, std::vector<Chunk> chunks,
                                    const RankMasks* masks) {
  const int32_t world_size = world.world_size();
  if (static_cast<int64_t>(lengths.size()) != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("lengths: ", lengths.size(),
                                                   " ranks, the world has ", world_size));
  }
  Plan plan = internal::EmptyPlanOf(world);
  if (masks != nullptr) plan.masks = *masks;
  const int32_t total_bags = world.total_bags();
  std::vector<int32_t> bag_of_rank(world_size);
  for (int32_t bag = 0; bag < total_bags; ++bag) {
    for (int32_t p = 0; p < plan.bag_gpus[bag]; ++p) {
      bag_of_rank[plan.bag_first_rank[bag] + p] = bag;
    }
  }

  plan.rank_first_sequence.resize(world_size + 1);
  int64_t num_sequences = 0;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    plan.rank_first_sequence[rank] = static_cast<int32_t>(num_sequences);
    num_sequences += static_cast<int64_t>(lengths[rank].size());
  }
  if (num_sequences > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("lengths: ", num_sequences, " sequences"));
  }
  plan.rank_first_sequence[world_size] = static_cast<int32_t>(num_sequences);
  plan.sequences.resize(num_sequences);
  plan.workload_before.assign(world_size, 0.0);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const int32_t base = plan.rank_first_sequence[rank];
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      PlacedSequence& seq = plan.sequences[base + i];
      seq.src_rank = rank;
      seq.seq_index = static_cast<int32_t>(i);
      seq.length = lengths[rank][i];
      plan.workload_before[rank] += cost.Workload(seq.length, MaskOf(masks, rank, i));
    }
  }

  // Chunks arrive grouped by sequence, sequences in id order; each sequence
  // takes the bag of its first chunk's destination (ValidatePlan then checks
  // that the others stay in it).
  std::vector<double> bag_attention(total_bags, 0.0);
  std::vector<int64_t> tokens_after(world_size, 0);
  int64_t next_sequence = 0;  // every sequence before it has its first_chunk set
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Chunk& chunk = chunks[c];
    if (chunk.src_rank < 0 || chunk.src_rank >= world_size || chunk.seq_index < 0 ||
        static_cast<size_t>(chunk.seq_index) >= lengths[chunk.src_rank].size()) {
      return Malformed(absl::StrCat("chunk ", c, " names sequence ", chunk.seq_index,
                                    " of rank ", chunk.src_rank, ", which does not exist"));
    }
    if (chunk.dst_rank < 0 || chunk.dst_rank >= world_size) {
      return Malformed(absl::StrCat("chunk ", c, " goes to rank ", chunk.dst_rank,
                                    ", outside [0, ", world_size, ")"));
    }
    const int64_t id = plan.rank_first_sequence[chunk.src_rank] + chunk.seq_index;
    if (id + 1 < next_sequence) {
      return Malformed(absl::StrCat("chunk ", c, " is out of (src_rank, seq_index) order"));
    }
    while (next_sequence <= id) {
      plan.sequences[next_sequence++].first_chunk = static_cast<int32_t>(c);
    }
    PlacedSequence& seq = plan.sequences[id];
    // Checked here, not only by ValidatePlan after: the sums below stay in range.
    if (chunk.length < 0 || chunk.length > seq.length) {
      return Malformed(absl::StrCat("chunk ", c, " has length ", chunk.length, ", outside [0, ",
                                    seq.length, "] (its sequence's)"));
    }
    if (seq.num_chunks == 0) {
      seq.bag = bag_of_rank[chunk.dst_rank];
      bag_attention[seq.bag] +=
          cost.Attention(seq.length, MaskOf(masks, chunk.src_rank, chunk.seq_index));
    }
    ++seq.num_chunks;
    tokens_after[chunk.dst_rank] += chunk.length;
  }
  while (next_sequence < num_sequences) {
    plan.sequences[next_sequence++].first_chunk = static_cast<int32_t>(chunks.size());
  }
  internal::PriceWorkloadAfter(cost, tokens_after, bag_attention, plan);
  plan.chunks = std::move(chunks);
  plan.IndexBags();
  if (absl::Status valid = ValidatePlan(plan, world, lengths); !valid.ok()) {
    return Malformed(std::string(valid.message()));
  }
  return plan;
}

}  // namespace knapformer
