#include "planner/replica_solve.h"

#include <sys/mman.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/bag_split.h"
#include "planner/chunk_table_cache.h"
#include "planner/replica_packer.h"

namespace knapformer {
namespace internal {
namespace {

// glibc serves any block of at least this size with a fresh mmap (its
// largest mmap threshold; smaller blocks may come from the heap).
constexpr size_t kFreshMapBytes = size_t{32} << 20;

// Asks the kernel to back the 2 MiB-aligned part of a block of at least
// kFreshMapBytes with huge pages; a hint, a no-op where unsupported or
// refused. Why: such a block is mapped anew by every plan that allocates
// it (the chunk table of g8 at 65,536 GPUs is 67 MB), and faulting it in
// 4 KiB at a time took a third of planning there (16k faults a plan on
// this VM, bench/planner_curve); with huge pages it is 32 faults.
// Transparent huge pages in "madvise" mode (Debian's default) serve
// exactly such hinted ranges. Smaller blocks are left alone: on the heap,
// a hint would split its mapping.
void AdviseHugePages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < kFreshMapBytes) return;
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Writes one chunk with streaming (non-temporal) stores where the target
// has them (x86-64 always does). Why: a chunk table too large for the
// caches (64 MiB in g8 at 65,536 GPUs) written with ordinary stores is
// read into the cache line by line before each line is overwritten, twice
// the memory traffic; streaming stores skip that read, 4-8% of planning g8
// there (bench/planner_curve). Every byte of the chunk is written (its
// padding as zeros). Readers on other threads need StreamedChunksDone()
// first.
inline void StreamChunk(Chunk* slot, int32_t src_rank, int32_t seq_index, int64_t offset,
                        int64_t length, int32_t dst_rank) {
#if defined(__SSE2__)
  static_assert(sizeof(Chunk) == 32 && offsetof(Chunk, seq_index) == 4 &&
                    offsetof(Chunk, offset) == 8 && offsetof(Chunk, length) == 16 &&
                    offsetof(Chunk, dst_rank) == 24,
                "StreamChunk writes Chunk's layout as two 16-byte halves");
  static_assert(__STDCPP_DEFAULT_NEW_ALIGNMENT__ >= 16,
                "a std::vector<Chunk>'s chunks must be 16-byte aligned for _mm_stream_si128");
  const uint64_t ranks =
      (uint64_t{static_cast<uint32_t>(seq_index)} << 32) | static_cast<uint32_t>(src_rank);
  __m128i* halves = reinterpret_cast<__m128i*>(slot);
  _mm_stream_si128(halves, _mm_set_epi64x(offset, static_cast<int64_t>(ranks)));
  _mm_stream_si128(halves + 1,
                   _mm_set_epi64x(static_cast<int64_t>(static_cast<uint32_t>(dst_rank)), length));
#else
  // Field by field: a Chunk{...} temporary was built on the stack and
  // copied with loads that straddled its stores (a store-forwarding stall).
  slot->src_rank = src_rank;
  slot->seq_index = seq_index;
  slot->offset = offset;
  slot->length = length;
  slot->dst_rank = dst_rank;
#endif
}

// Orders the streaming stores before any later store (a plan handed to
// another thread after it).
inline void StreamedChunksDone() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace

std::vector<int32_t> FirstSequences(const RankLengths& lengths) {
  std::vector<int32_t> first(lengths.size() + 1);
  int32_t count = 0;
  for (size_t rank = 0; rank < lengths.size(); ++rank) {
    first[rank] = count;
    count += static_cast<int32_t>(lengths[rank].size());
  }
  first[lengths.size()] = count;
  return first;
}

absl::StatusOr<int64_t> AssignReplicaBags(const Topology& topology,
                                          const BalancerOptions& options,
                                          SortedSequences sorted, int32_t first_rank,
                                          const std::vector<int32_t>& first_sequence,
                                          std::vector<int32_t>& bag_of) {
  ReplicaPacker packer(topology, options.greedy, options.refine_rounds,
                       options.max_tokens_per_gpu, options.rank_speeds, std::move(sorted),
                       first_rank, first_sequence);
  if (packer.empty()) return 0;
  if (absl::Status status = packer.PackGreedy(); !status.ok()) return status;
  packer.TryOtherRule();
  packer.TryMultifit();
  packer.TryAllHome();
  if (options.locality) packer.TryLocality(options.locality_slack);
  return packer.WriteBags(bag_of);
}

Plan EmptyPlanOf(const World& world) {
  Plan plan;
  plan.world_size = world.world_size();
  plan.topology = world.spec();
  plan.bags_per_replica = world.uniform() ? world.topology().num_bags() : 0;
  plan.bag_first_rank.resize(world.total_bags());
  plan.bag_gpus.resize(world.total_bags());
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    for (const Bag& bag : world.replica_topology(replica).bags()) {
      const int32_t global = world.first_bag(replica) + bag.id;
      plan.bag_first_rank[global] = replica * world.group_size() + bag.first_rank;
      plan.bag_gpus[global] = bag.gpus;
    }
  }
  return plan;
}

void PriceWorkloadAfter(const CostModel& cost, const std::vector<int64_t>& tokens_after,
                        const std::vector<double>& bag_attention, Plan& plan) {
  plan.workload_after.assign(tokens_after.size(), 0.0);
  for (size_t bag = 0; bag < bag_attention.size(); ++bag) {
    const double per_gpu = bag_attention[bag] / plan.bag_gpus[bag];
    for (int32_t p = 0; p < plan.bag_gpus[bag]; ++p) {
      const int32_t rank = plan.bag_first_rank[bag] + p;
      plan.workload_after[rank] = cost.Linear(tokens_after[rank]) + per_gpu;
    }
  }
}

absl::StatusOr<Plan> BuildPlan(const World& world, const CostModel& cost,
                               const RankLengths& lengths, const BalancerOptions& options,
                               std::vector<int32_t> first_sequence,
                               const std::vector<int32_t>& bag_of, int64_t num_chunks,
                               const RankMasks* masks) {
  const int32_t world_size = world.world_size();
  const int32_t group = world.group_size();
  const int32_t total_bags = world.total_bags();

  Plan plan = EmptyPlanOf(world);
  plan.rank_first_sequence = std::move(first_sequence);
  const int32_t num_sequences = plan.rank_first_sequence[world_size];

  // The chunk count is checked before the table is allocated.
  if (num_chunks < 0) {
    return absl::InternalError(absl::StrCat("plan: num_chunks ", num_chunks, " is negative"));
  }
  if (num_chunks > options.limits.max_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "plan: ", num_chunks, " chunks exceed the limit of ", options.limits.max_chunks));
  }

  // Phase 2: chunks, in (src_rank, seq_index, offset) order.
  plan.sequences.resize(num_sequences);
  if (options.chunk_tables != nullptr) plan.chunks = options.chunk_tables->Take(num_chunks);
  if (plan.chunks.capacity() < static_cast<size_t>(num_chunks)) {
    // A table kept for the next plans gets room for a slightly larger step
    // too: sized to this one alone, half the next steps would not fit it.
    const int64_t room =
        options.chunk_tables == nullptr
            ? num_chunks
            : std::max(num_chunks, std::min(num_chunks + num_chunks / 16,
                                            options.limits.max_chunks));
    plan.chunks.reserve(room);
    AdviseHugePages(plan.chunks.data(), room * sizeof(Chunk));
  }
  // A table from the cache already holds (stale) chunks and is only cut
  // or grown at its end; a new one is zeroed here. Either way each chunk
  // is then streamed in place (StreamChunk), not read first.
  plan.chunks.resize(num_chunks);
  Chunk* const chunks = plan.chunks.data();
  int32_t written = 0;  // PlacedSequence holds chunk indexes as int32
  plan.workload_before.assign(world_size, 0.0);
  std::vector<int32_t> rotation(total_bags, 0);  // position of the next extra token
  // Per bag: every sequence's tokens per GPU rounded down, and the extra
  // tokens dealt one a GPU from position 0 on; each GPU's tokens follow
  // from them at the end, not one addition per chunk (2 million a step in
  // g8 at 65,536 GPUs).
  std::vector<int64_t> bag_shares(total_bags, 0), bag_extras(total_bags, 0);
  std::vector<double> bag_attention(total_bags, 0.0);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const int32_t first_bag = world.first_bag(rank / group);
    const int32_t base = plan.rank_first_sequence[rank];
    for (size_t i = 0; i < lengths[rank].size(); ++i) {
      const int64_t length = lengths[rank][i];
      PlacedSequence& seq = plan.sequences[base + i];
      seq.src_rank = rank;
      seq.seq_index = static_cast<int32_t>(i);
      seq.length = length;
      seq.first_chunk = written;
      const AttentionMask* mask = MaskOf(masks, rank, i);
      // Workload(length, mask) exactly, its attention priced once.
      const double attention = cost.Attention(length, mask);
      plan.workload_before[rank] += cost.Linear(length) + attention;
      if (bag_of[base + i] < 0) continue;
      const int32_t bag = first_bag + bag_of[base + i];
      const int32_t gpus = plan.bag_gpus[bag];
      seq.bag = bag;
      if (num_chunks - written < ChunksOverBag(length, gpus)) {
        return absl::InternalError(absl::StrCat("plan: num_chunks ", num_chunks,
                                                " is fewer than bag_of makes"));
      }
      const BagSplit split = SplitOverBag(length, gpus);
      const int32_t start = rotation[bag];
      int64_t offset = 0;
      for (int32_t position = 0; position < gpus; ++position) {
        const int64_t chunk_length = ChunkAt(split, position, start, gpus);
        if (chunk_length == 0) continue;
        const int32_t dst = plan.bag_first_rank[bag] + position;
        StreamChunk(&chunks[written++], rank, seq.seq_index, offset, chunk_length, dst);
        offset += chunk_length;
      }
      rotation[bag] = NextRotation(start, split, gpus);
      seq.num_chunks = written - seq.first_chunk;
      bag_shares[bag] += split.share;
      bag_extras[bag] += split.extra;
      bag_attention[bag] += attention;
    }
  }
  StreamedChunksDone();
  if (written != num_chunks) {
    return absl::InternalError(
        absl::StrCat("plan: num_chunks ", num_chunks, " but bag_of makes ", written));
  }
  std::vector<int64_t> tokens_after(world_size);
  for (int32_t bag = 0; bag < total_bags; ++bag) {
    const int32_t gpus = plan.bag_gpus[bag];
    for (int32_t p = 0; p < gpus; ++p) {
      tokens_after[plan.bag_first_rank[bag] + p] =
          TokensAt(bag_shares[bag], bag_extras[bag], gpus, p);
    }
  }
  PriceWorkloadAfter(cost, tokens_after, bag_attention, plan);

  plan.IndexBags();
  return plan;
}

}  // namespace internal
}  // namespace knapformer
