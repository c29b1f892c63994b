#include "planner/plan.h"

#include <algorithm>
#include <limits>
#include <tuple>

namespace knapformer {

Route ReverseRoute(const Route& forward) {
  Route reverse;
  reverse.sends = forward.recvs;
  reverse.recvs = forward.sends;
  return reverse;
}

void Plan::IndexBags() {
  // A counting sort keeps each bag's sequences in id order.
  const int32_t total_bags = static_cast<int32_t>(bag_first_rank.size());
  bag_begin.assign(total_bags + 1, 0);
  for (const PlacedSequence& seq : sequences) {
    if (seq.bag >= 0) ++bag_begin[seq.bag + 1];
  }
  for (int32_t b = 0; b < total_bags; ++b) bag_begin[b + 1] += bag_begin[b];
  bag_sequences.resize(bag_begin[total_bags]);
  std::vector<int32_t> next(bag_begin.begin(), bag_begin.end() - 1);
  for (int32_t s = 0; s < static_cast<int32_t>(sequences.size()); ++s) {
    const int32_t bag = sequences[s].bag;
    if (bag >= 0) bag_sequences[next[bag]++] = s;
  }
}

RankPlan Plan::Slice(int32_t rank) const {
  RankPlan slice;
  slice.rank = rank;
  slice.world_size = world_size;
  slice.workload_before = workload_before[rank];
  slice.workload_after = workload_after[rank];

  for (int32_t s = rank_first_sequence[rank]; s < rank_first_sequence[rank + 1]; ++s) {
    const PlacedSequence& seq = sequences[s];
    for (int32_t c = seq.first_chunk; c < seq.first_chunk + seq.num_chunks; ++c) {
      const Chunk& chunk = chunks[c];
      slice.route.sends.push_back({chunk.dst_rank, chunk.seq_index, chunk.offset, chunk.length});
    }
  }
  // A sequence never sends two chunks to the same rank, so (peer, seq_index)
  // is a total order here.
  std::sort(slice.route.sends.begin(), slice.route.sends.end(),
            [](const Transfer& a, const Transfer& b) {
              return std::tie(a.peer, a.seq_index) < std::tie(b.peer, b.seq_index);
            });

  // Global bags are laid out by first rank ascending.
  const auto it = std::upper_bound(bag_first_rank.begin(), bag_first_rank.end(), rank);
  const int32_t bag = static_cast<int32_t>(it - bag_first_rank.begin()) - 1;
  UlyssesBag& ulysses = slice.ulysses;
  ulysses.first_rank = bag_first_rank[bag];
  ulysses.gpus = bag_gpus[bag];
  ulysses.position = rank - ulysses.first_rank;

  // One pass over the bag's sequences, in bag order, which is (src_rank,
  // seq_index) order: the all-to-all's receive order. Each gives this rank's
  // receive (if it holds a chunk of it) and, in a multi-GPU bag, its Ulysses
  // entry.
  for (int32_t i = bag_begin[bag]; i < bag_begin[bag + 1]; ++i) {
    const PlacedSequence& seq = sequences[bag_sequences[i]];
    const Chunk* mine = nullptr;
    if (seq.num_chunks == ulysses.gpus) {
      mine = &chunks[seq.first_chunk + ulysses.position];
    } else {  // a sequence shorter than the bag: some positions have no chunk
      for (int32_t c = seq.first_chunk; c < seq.first_chunk + seq.num_chunks; ++c) {
        if (chunks[c].dst_rank == rank) mine = &chunks[c];
      }
    }
    if (mine != nullptr) {
      slice.route.recvs.push_back({mine->src_rank, mine->seq_index, mine->offset, mine->length});
      slice.compute_chunk_lengths.push_back(mine->length);
    }
    if (!masks.empty() && (ulysses.gpus > 1 || mine != nullptr)) {
      slice.attention_masks.push_back(masks[seq.src_rank][seq.seq_index]);
    }
    if (ulysses.gpus > 1) {
      UlyssesSequence entry;
      entry.src_rank = seq.src_rank;
      entry.seq_index = seq.seq_index;
      entry.length = seq.length;
      entry.chunk_lengths.assign(ulysses.gpus, 0);
      for (int32_t c = seq.first_chunk; c < seq.first_chunk + seq.num_chunks; ++c) {
        entry.chunk_lengths[chunks[c].dst_rank - ulysses.first_rank] = chunks[c].length;
      }
      ulysses.sequences.push_back(std::move(entry));
    }
  }
  return slice;
}

int64_t Plan::MovedTokens() const {
  int64_t moved = 0;
  for (const Chunk& chunk : chunks) {
    if (chunk.src_rank != chunk.dst_rank) moved += chunk.length;
  }
  return moved;
}

int64_t MovedBytes(int64_t moved_tokens, int64_t token_bytes) {
  if (token_bytes <= 0) return 0;
  if (moved_tokens > std::numeric_limits<int64_t>::max() / token_bytes) {
    return std::numeric_limits<int64_t>::max();
  }
  return moved_tokens * token_bytes;
}

int64_t Plan::MovedBytes(int64_t token_bytes) const {
  return knapformer::MovedBytes(MovedTokens(), token_bytes);
}

std::vector<int64_t> Plan::TokensPerRank() const {
  std::vector<int64_t> tokens(world_size, 0);
  for (const Chunk& chunk : chunks) tokens[chunk.dst_rank] += chunk.length;
  return tokens;
}

int64_t Plan::TotalTokens() const {
  int64_t total = 0;
  for (const PlacedSequence& seq : sequences) total += seq.length;
  return total;
}

}  // namespace knapformer
