#include "planner/validate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError(absl::StrCat("invalid plan: ", what));
}

}  // namespace

absl::Status ValidatePlan(const Plan& plan, const World& world, const RankLengths& lengths) {
  const int32_t world_size = world.world_size();
  if (plan.world_size != world_size || static_cast<int32_t>(lengths.size()) != world_size) {
    return Violation("world size mismatch");
  }
  if (plan.topology != world.spec()) return Violation("topology mismatch");
  if (static_cast<int32_t>(plan.rank_first_sequence.size()) != world_size + 1) {
    return Violation("rank_first_sequence has the wrong size");
  }
  const int32_t total_bags = world.total_bags();
  const int32_t group = world.group_size();
  if (static_cast<int32_t>(plan.bag_first_rank.size()) != total_bags ||
      static_cast<int32_t>(plan.bag_gpus.size()) != total_bags) {
    return Violation("bag tables have the wrong size");
  }
  std::vector<int32_t> replica_of_bag(total_bags);
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    for (const Bag& bag : world.replica_topology(replica).bags()) {
      const int32_t b = world.first_bag(replica) + bag.id;
      replica_of_bag[b] = replica;
      if (plan.bag_first_rank[b] != replica * group + bag.first_rank ||
          plan.bag_gpus[b] != bag.gpus) {
        return Violation(absl::StrCat("bag ", b, " does not match the topology"));
      }
    }
  }

  int32_t expected_chunk = 0;
  int32_t id = 0;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    if (plan.rank_first_sequence[rank] != id) {
      return Violation(absl::StrCat("rank ", rank, " sequences do not start at ", id));
    }
    for (size_t i = 0; i < lengths[rank].size(); ++i, ++id) {
      if (id >= static_cast<int32_t>(plan.sequences.size())) {
        return Violation("fewer placed sequences than input sequences");
      }
      const PlacedSequence& seq = plan.sequences[id];
      const std::string name = absl::StrCat("sequence (rank ", rank, ", index ", i, ")");
      if (seq.src_rank != rank || seq.seq_index != static_cast<int32_t>(i) ||
          seq.length != lengths[rank][i]) {
        return Violation(name + " is recorded with the wrong source or length");
      }
      if (seq.first_chunk != expected_chunk) {
        return Violation(name + " chunks are not consecutive in the chunk list");
      }
      if (seq.length == 0) {
        if (seq.num_chunks != 0 || seq.bag != -1) {
          return Violation(name + " is empty but has chunks or a bag");
        }
        continue;
      }
      if (seq.bag < 0 || seq.bag >= total_bags) {
        return Violation(name + " has no valid bag");
      }
      if (replica_of_bag[seq.bag] != rank / group) {
        return Violation(name + " left its replica");
      }
      const int32_t first = plan.bag_first_rank[seq.bag];
      const int32_t gpus = plan.bag_gpus[seq.bag];
      if (seq.num_chunks < 1 || seq.num_chunks > gpus ||
          seq.first_chunk + seq.num_chunks > static_cast<int32_t>(plan.chunks.size())) {
        return Violation(absl::StrCat(name, " has ", seq.num_chunks, " chunks in a bag of ",
                                      gpus, " GPUs"));
      }
      int64_t covered = 0;
      int32_t previous_dst = first - 1;
      for (int32_t c = seq.first_chunk; c < seq.first_chunk + seq.num_chunks; ++c) {
        const Chunk& chunk = plan.chunks[c];
        if (chunk.src_rank != rank || chunk.seq_index != static_cast<int32_t>(i)) {
          return Violation(absl::StrCat(name, ": chunk ", c, " belongs elsewhere"));
        }
        if (chunk.length <= 0) return Violation(absl::StrCat(name, ": chunk ", c, " is empty"));
        if (chunk.offset != covered) {
          return Violation(absl::StrCat(name, ": chunk ", c, " starts at ", chunk.offset,
                                        ", expected ", covered, " (gap or overlap)"));
        }
        if (chunk.dst_rank <= previous_dst || chunk.dst_rank >= first + gpus) {
          return Violation(absl::StrCat(name, ": chunk ", c, " goes to rank ", chunk.dst_rank,
                                        ", outside its bag or out of position order"));
        }
        previous_dst = chunk.dst_rank;
        covered += chunk.length;
      }
      if (covered != seq.length) {
        return Violation(absl::StrCat(name, ": chunks cover ", covered, " of ", seq.length,
                                      " tokens"));
      }
      expected_chunk += seq.num_chunks;
    }
  }
  if (id != static_cast<int32_t>(plan.sequences.size())) {
    return Violation("more placed sequences than input sequences");
  }
  if (expected_chunk != static_cast<int32_t>(plan.chunks.size())) {
    return Violation("chunks that belong to no sequence");
  }

  // Bag index.
  if (plan.bag_begin.size() != static_cast<size_t>(total_bags + 1)) {
    return Violation("bag index has the wrong size");
  }
  for (int32_t b = 0; b < total_bags; ++b) {
    for (int32_t k = plan.bag_begin[b]; k < plan.bag_begin[b + 1]; ++k) {
      const int32_t s = plan.bag_sequences[k];
      if (plan.sequences[s].bag != b || (k > plan.bag_begin[b] && s <= plan.bag_sequences[k - 1])) {
        return Violation(absl::StrCat("bag index is wrong at bag ", b));
      }
    }
  }

  // Workload bookkeeping: nothing created or lost.
  double before = 0, after = 0;
  for (int32_t r = 0; r < world_size; ++r) {
    before += plan.workload_before[r];
    after += plan.workload_after[r];
  }
  if (std::fabs(before - after) > 1e-9 * std::max(1.0, before)) {
    return Violation(absl::StrCat("workload before (", before, ") and after (", after,
                                  ") differ"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSlices(const Plan& plan, const RankLengths& lengths) {
  const int32_t world_size = plan.world_size;
  using Key = std::tuple<int32_t, int32_t, int32_t, int64_t, int64_t>;  // src,dst,seq,off,len
  std::vector<Key> sent, received;
  std::vector<RankPlan> slices;
  slices.reserve(world_size);
  for (int32_t rank = 0; rank < world_size; ++rank) slices.push_back(plan.Slice(rank));

  for (const RankPlan& slice : slices) {
    const int32_t rank = slice.rank;
    const Route& route = slice.route;
    for (size_t k = 0; k < route.sends.size(); ++k) {
      const Transfer& t = route.sends[k];
      if (k > 0 && std::tie(route.sends[k - 1].peer, route.sends[k - 1].seq_index) >=
                       std::tie(t.peer, t.seq_index)) {
        return Violation(absl::StrCat("sends of rank ", rank, " are not in buffer order"));
      }
      sent.emplace_back(rank, t.peer, t.seq_index, t.offset, t.length);
    }
    if (slice.compute_chunk_lengths.size() != route.recvs.size()) {
      return Violation(absl::StrCat("rank ", rank, ": compute lengths and receives differ"));
    }
    for (size_t k = 0; k < route.recvs.size(); ++k) {
      const Transfer& t = route.recvs[k];
      if (k > 0 && std::tie(route.recvs[k - 1].peer, route.recvs[k - 1].seq_index) >=
                       std::tie(t.peer, t.seq_index)) {
        return Violation(absl::StrCat("receives of rank ", rank, " are not in buffer order"));
      }
      if (slice.compute_chunk_lengths[k] != t.length) {
        return Violation(absl::StrCat("rank ", rank, ": compute length ", k, " is wrong"));
      }
      received.emplace_back(t.peer, rank, t.seq_index, t.offset, t.length);
    }

    // Ulysses: this rank's non-empty chunks, in bag order, are its receives.
    const UlyssesBag& bag = slice.ulysses;
    if (bag.gpus > 1) {
      size_t k = 0;
      for (const UlyssesSequence& seq : bag.sequences) {
        int64_t sum = 0;
        for (int64_t c : seq.chunk_lengths) sum += c;
        if (sum != seq.length || static_cast<int32_t>(seq.chunk_lengths.size()) != bag.gpus) {
          return Violation(absl::StrCat("rank ", rank, ": Ulysses chunk lengths of (",
                                        seq.src_rank, ", ", seq.seq_index, ") are wrong"));
        }
        const int64_t mine = seq.chunk_lengths[bag.position];
        if (mine == 0) continue;
        if (k >= route.recvs.size() || route.recvs[k].peer != seq.src_rank ||
            route.recvs[k].seq_index != seq.seq_index || route.recvs[k].length != mine) {
          return Violation(absl::StrCat("rank ", rank, ": receives do not follow the bag order"));
        }
        ++k;
      }
      if (k != route.recvs.size()) {
        return Violation(absl::StrCat("rank ", rank, ": receives outside its bag's sequences"));
      }
    }

    // The reverse route brings back exactly this rank's tokens.
    const Route reverse = ReverseRoute(route);
    std::vector<std::pair<int64_t, int64_t>> pieces;  // (global token offset, length)
    std::vector<int64_t> start(lengths[rank].size() + 1, 0);
    for (size_t i = 0; i < lengths[rank].size(); ++i) start[i + 1] = start[i] + lengths[rank][i];
    for (const Transfer& t : reverse.recvs) {
      if (t.seq_index < 0 || t.seq_index >= static_cast<int32_t>(lengths[rank].size()) ||
          t.offset < 0 || t.offset + t.length > lengths[rank][t.seq_index]) {
        return Violation(absl::StrCat("rank ", rank, ": reverse route gets a foreign piece"));
      }
      pieces.emplace_back(start[t.seq_index] + t.offset, t.length);
    }
    std::sort(pieces.begin(), pieces.end());
    int64_t covered = 0;
    for (const auto& [offset, length] : pieces) {
      if (offset != covered) {
        return Violation(absl::StrCat("rank ", rank, ": reverse route leaves a gap or overlap at token ",
                                      covered));
      }
      covered += length;
    }
    if (covered != start.back()) {
      return Violation(absl::StrCat("rank ", rank, ": reverse route restores ", covered, " of ",
                                    start.back(), " tokens"));
    }
  }
  std::sort(sent.begin(), sent.end());
  std::sort(received.begin(), received.end());
  if (sent != received) return Violation("sends and receives of the ranks do not match");
  return absl::OkStatus();
}

}  // namespace knapformer
