#include "planner/chunk_table_cache.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/auto_layout.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/replica_solve.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

// A table of `size` chunks no plan makes (every field -7), with `room`:
// what a plan's table holds when given back.
std::vector<Chunk> StaleTable(size_t size, size_t room) {
  std::vector<Chunk> table;
  table.reserve(room);
  table.resize(size, Chunk{-7, -7, -7, -7, -7});
  return table;
}

void ExpectSameChunks(const std::vector<Chunk>& got, const std::vector<Chunk>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t c = 0; c < want.size(); ++c) {
    EXPECT_EQ(got[c].src_rank, want[c].src_rank) << c;
    EXPECT_EQ(got[c].seq_index, want[c].seq_index) << c;
    EXPECT_EQ(got[c].offset, want[c].offset) << c;
    EXPECT_EQ(got[c].length, want[c].length) << c;
    EXPECT_EQ(got[c].dst_rank, want[c].dst_rank) << c;
  }
}

TEST(ChunkTableCache, AnEmptyCacheGivesATableWithNoRoom) {
  ChunkTableCache cache;
  EXPECT_EQ(cache.kept_bytes(), 0);
  EXPECT_EQ(cache.Take(0).capacity(), 0u);
  EXPECT_EQ(cache.Take(10).capacity(), 0u);
}

TEST(ChunkTableCache, KeepsTheTableOfMostRoomAndGivesItSized) {
  ChunkTableCache cache;
  cache.GiveBack(StaleTable(1, 100));
  cache.GiveBack(StaleTable(1, 40));  // less room: freed, the 100 stay
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(100 * sizeof(Chunk)));
  EXPECT_EQ(cache.Take(101).capacity(), 0u);  // too small: still kept
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(100 * sizeof(Chunk)));
  std::vector<Chunk> taken = cache.Take(100);
  EXPECT_EQ(taken.capacity(), 100u);
  EXPECT_EQ(taken.size(), 100u);  // the one chunk it held, then zeroed ones
  EXPECT_EQ(cache.kept_bytes(), 0);  // taken, no longer kept
  cache.GiveBack(std::move(taken));
  cache.GiveBack(StaleTable(1, 300));  // more room: kept instead
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(300 * sizeof(Chunk)));
}

// A plan made with a cache fills the table kept, and is the plan made
// without one; its table given back serves the next plan.
TEST(ChunkTableCache, PlansFillTheKeptTableAndAreTheSame) {
  const CostModel cost = *CostModel::Create(1024, 1.0);
  const World world = *World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 16);
  RankLengths lengths(16);
  for (int32_t r = 0; r < 16; ++r) {
    for (int32_t i = 0; i <= r % 4; ++i) lengths[r].push_back(100 + 37 * r + 511 * i);
  }
  BalancerOptions options;
  const absl::StatusOr<Plan> alone = BalanceGreedy(world, cost, lengths, options);
  ASSERT_TRUE(alone.ok()) << alone.status();

  ChunkTableCache cache;
  options.chunk_tables = &cache;
  // Every chunk of a kept table is overwritten: one holding more stale
  // chunks than the plan makes, and one holding fewer (its room enough).
  const size_t made = alone->chunks.size();
  for (size_t stale : {made + 5, made / 2}) {
    std::vector<Chunk> kept = StaleTable(stale, made + 5);
    const Chunk* storage = kept.data();
    cache.GiveBack(std::move(kept));
    absl::StatusOr<Plan> cached = BalanceGreedy(world, cost, lengths, options);
    ASSERT_TRUE(cached.ok()) << cached.status();
    EXPECT_EQ(cached->chunks.data(), storage);
    EXPECT_EQ(cache.kept_bytes(), 0);
    ExpectSameChunks(cached->chunks, alone->chunks);
    EXPECT_EQ(cached->workload_after, alone->workload_after);
  }

  // A table too small is left kept; the plan allocates its own, with room
  // for a slightly larger step, since a cache keeps it for the next.
  cache.GiveBack(StaleTable(1, 1));
  absl::StatusOr<Plan> fresh = BalanceGreedy(world, cost, lengths, options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(sizeof(Chunk)));
  EXPECT_GT(fresh->chunks.capacity(), fresh->chunks.size());

  // Auto's plan takes it too.
  std::vector<Chunk> big = StaleTable(4096, 4096);
  const Chunk* big_storage = big.data();
  cache.GiveBack(std::move(big));
  const absl::StatusOr<CommPrices> prices = CommPrices::Create(Machine(), cost, 0);
  ASSERT_TRUE(prices.ok()) << prices.status();
  absl::StatusOr<AutoPlan> automatic =
      BalanceAuto(AutoLayout(), 16, cost, *prices, lengths, options);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->plan.chunks.data(), big_storage);
  options.chunk_tables = nullptr;
  absl::StatusOr<AutoPlan> uncached =
      BalanceAuto(AutoLayout(), 16, cost, *prices, lengths, options);
  ASSERT_TRUE(uncached.ok()) << uncached.status();
  ExpectSameChunks(automatic->plan.chunks, uncached->plan.chunks);
}

// BuildPlan writes its chunks in place into a table sized to the count the
// packing gave: a count that does not match what bag_of makes is refused,
// never written past.
TEST(ChunkTableCache, BuildPlanRefusesAChunkCountThatIsNotBagOfs) {
  const CostModel cost = *CostModel::Create(1024, 1.0);
  const World world = *World::Create(*Topology::Parse("g2n2"), 4);
  const RankLengths lengths = {{10, 1}, {7}, {}, {5}};
  const std::vector<int32_t> first_sequence = internal::FirstSequences(lengths);
  // Sequences 10, 1, 7, 5 in bags 0, 1, 1, 0 of two GPUs: 2 + 1 + 2 + 2 chunks.
  const std::vector<int32_t> bag_of = {0, 1, 1, 0};
  BalancerOptions options;
  ChunkTableCache cache;
  options.chunk_tables = &cache;
  absl::StatusOr<Plan> plan =
      internal::BuildPlan(world, cost, lengths, options, first_sequence, bag_of, 7);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunks.size(), 7u);
  for (int64_t wrong : {6, 8, 0, -1}) {
    cache.GiveBack(StaleTable(16, 16));
    const absl::StatusOr<Plan> refused =
        internal::BuildPlan(world, cost, lengths, options, first_sequence, bag_of, wrong);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal) << wrong;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "num_chunks")) << wrong;
  }
}

}  // namespace
}  // namespace knapformer
