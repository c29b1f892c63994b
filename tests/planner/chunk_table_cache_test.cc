#include "planner/chunk_table_cache.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "planner/auto_layout.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/machine.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

std::vector<Chunk> TableWithRoom(size_t room) {
  std::vector<Chunk> table;
  table.reserve(room);
  table.emplace_back();
  return table;
}

TEST(ChunkTableCache, AnEmptyCacheGivesATableWithNoRoom) {
  ChunkTableCache cache;
  EXPECT_EQ(cache.kept_bytes(), 0);
  EXPECT_EQ(cache.Take(0).capacity(), 0u);
  EXPECT_EQ(cache.Take(10).capacity(), 0u);
}

TEST(ChunkTableCache, KeepsTheTableOfMostRoomAndGivesItEmptied) {
  ChunkTableCache cache;
  cache.GiveBack(TableWithRoom(100));
  cache.GiveBack(TableWithRoom(40));  // less room: freed, the 100 stay
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(100 * sizeof(Chunk)));
  EXPECT_EQ(cache.Take(101).capacity(), 0u);  // too small: still kept
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(100 * sizeof(Chunk)));
  std::vector<Chunk> taken = cache.Take(100);
  EXPECT_EQ(taken.capacity(), 100u);
  EXPECT_TRUE(taken.empty());
  EXPECT_EQ(cache.kept_bytes(), 0);  // taken, no longer kept
  cache.GiveBack(std::move(taken));
  cache.GiveBack(TableWithRoom(300));  // more room: kept instead
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
  std::vector<Chunk> kept = TableWithRoom(alone->chunks.size() + 5);
  const Chunk* storage = kept.data();
  cache.GiveBack(std::move(kept));
  absl::StatusOr<Plan> cached = BalanceGreedy(world, cost, lengths, options);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->chunks.data(), storage);
  EXPECT_EQ(cache.kept_bytes(), 0);
  ASSERT_EQ(cached->chunks.size(), alone->chunks.size());
  for (size_t c = 0; c < alone->chunks.size(); ++c) {
    EXPECT_EQ(cached->chunks[c].src_rank, alone->chunks[c].src_rank) << c;
    EXPECT_EQ(cached->chunks[c].seq_index, alone->chunks[c].seq_index) << c;
    EXPECT_EQ(cached->chunks[c].offset, alone->chunks[c].offset) << c;
    EXPECT_EQ(cached->chunks[c].length, alone->chunks[c].length) << c;
    EXPECT_EQ(cached->chunks[c].dst_rank, alone->chunks[c].dst_rank) << c;
  }
  EXPECT_EQ(cached->workload_after, alone->workload_after);

  // A table too small is left kept; the plan allocates its own, with room
  // for a slightly larger step, since a cache keeps it for the next.
  cache.GiveBack(TableWithRoom(1));
  absl::StatusOr<Plan> fresh = BalanceGreedy(world, cost, lengths, options);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(cache.kept_bytes(), static_cast<int64_t>(sizeof(Chunk)));
  EXPECT_GT(fresh->chunks.capacity(), fresh->chunks.size());

  // Auto's plan takes it too.
  std::vector<Chunk> big = TableWithRoom(4096);
  const Chunk* big_storage = big.data();
  cache.GiveBack(std::move(big));
  const absl::StatusOr<CommPrices> prices = CommPrices::Create(Machine(), cost, 0);
  ASSERT_TRUE(prices.ok()) << prices.status();
  absl::StatusOr<AutoPlan> automatic =
      BalanceAuto(AutoLayout(), 16, cost, *prices, lengths, options);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  EXPECT_EQ(automatic->plan.chunks.data(), big_storage);
}

}  // namespace
}  // namespace knapformer
