// A rank's share of a step's plan: the counts and row orders it moves, and
// every check on a plan that came over the network.
#include "client/route_layout.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Rank 0 of 2, single-GPU bag: sequences of 3 and 2 tokens; it keeps the
// first and sends the second to rank 1, and receives 4 tokens from rank 1.
RankPlan TwoRankPlan() {
  RankPlan plan;
  plan.rank = 0;
  plan.world_size = 2;
  plan.route.sends = {{0, 0, 0, 3}, {1, 1, 0, 2}};
  plan.route.recvs = {{0, 0, 0, 3}, {1, 0, 0, 4}};
  plan.compute_chunk_lengths = {3, 4};
  plan.ulysses.first_rank = 0;
  plan.ulysses.gpus = 1;
  return plan;
}

absl::Status Derive(const RankPlan& plan, const std::vector<int64_t>& lengths, int bag_gpus = 1) {
  return DeriveRouteLayout(plan, lengths, 0, 2, bag_gpus, 0).status();
}

TEST(RouteLayout, CountsAndSendOrderOfAValidPlan) {
  auto layout = DeriveRouteLayout(TwoRankPlan(), {3, 2}, 0, 2, 1, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->input_rows, 5);
  EXPECT_THAT(layout->send_rows, ElementsAre(3, 2));
  EXPECT_THAT(layout->recv_rows, ElementsAre(3, 4));
  EXPECT_THAT(layout->send_index, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(layout->routed_rows, 7);
  EXPECT_THAT(layout->attention_lengths, ElementsAre(3, 4));
  EXPECT_TRUE(layout->ulysses_send_rows.empty());
  EXPECT_TRUE(AttentionIndex(layout->ulysses_recv_rows, TwoRankPlan().ulysses).empty());
}

TEST(RouteLayout, SendsOutOfPeerOrderAreRefused) {
  // The same transfers, rank 1's first: the send buffer would hold rank
  // 1's rows where the all-to-all sends rank 0's.
  RankPlan plan = TwoRankPlan();
  std::swap(plan.route.sends[0], plan.route.sends[1]);
  absl::Status status = Derive(plan, {3, 2});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "plan: rank 0's sends name rank 0 after rank 1; peers must ascend");
}

TEST(RouteLayout, ReceivesOutOfPeerOrderAreRefused) {
  RankPlan plan = TwoRankPlan();
  std::swap(plan.route.recvs[0], plan.route.recvs[1]);
  EXPECT_THAT(std::string(Derive(plan, {3, 2}).message()),
              HasSubstr("receives name rank 0 after rank 1; peers must ascend"));
}

TEST(RouteLayout, EveryTokenLeavesExactlyOnce) {
  RankPlan twice = TwoRankPlan();
  twice.route.sends = {{0, 0, 0, 2}, {1, 0, 1, 3}};  // 5 rows: row 1 twice, row 4 never
  EXPECT_EQ(Derive(twice, {4, 1}).message(), "plan: a token is sent twice");
  RankPlan short_plan = TwoRankPlan();
  short_plan.route.sends.pop_back();
  EXPECT_EQ(Derive(short_plan, {3, 2}).message(), "plan: rank 0 sends 3 of its 5 tokens");
}

TEST(RouteLayout, TransfersOutsideTheSequencesOrWorldAreRefused) {
  for (Transfer bad : {Transfer{1, 1, 1, 2}, Transfer{2, 1, 0, 2}, Transfer{1, 2, 0, 2},
                       Transfer{1, 1, -1, 2}, Transfer{1, 1, INT64_MAX, 2}}) {
    RankPlan plan = TwoRankPlan();
    plan.route.sends[1] = bad;
    EXPECT_THAT(std::string(Derive(plan, {3, 2}).message()),
                HasSubstr("plan: rank 0 is asked to send tokens outside sequence"))
        << bad.peer << " " << bad.seq_index << " " << bad.offset;
  }
  RankPlan plan = TwoRankPlan();
  plan.route.recvs[1].peer = 5;
  EXPECT_EQ(Derive(plan, {3, 2}).message(), "plan: rank 0 is to receive from rank 5");
}

TEST(RouteLayout, ChunkLengthsMustMatchTheReceives) {
  RankPlan plan = TwoRankPlan();
  plan.compute_chunk_lengths = {3, 3};
  EXPECT_EQ(Derive(plan, {3, 2}).message(), "plan: rank 0 receives 7 tokens but computes on 6");
}

// A 2-GPU bag at ranks 0-1: two sequences, 8 tokens split 5+3 and 3 split
// 2+1. Position 0 (this rank, computing on 7 tokens) receives its own
// chunks (5, then 2) and position 1's (3, then 1); attention wants each
// sequence whole.
TEST(RouteLayout, UlyssesOrderPutsEachSequenceTogether) {
  RankPlan plan = TwoRankPlan();
  plan.ulysses.gpus = 2;
  plan.ulysses.sequences = {{0, 0, 8, {5, 3}}, {1, 0, 3, {2, 1}}};
  auto layout = DeriveRouteLayout(plan, {3, 2}, 0, 2, 2, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_THAT(layout->ulysses_send_rows, ElementsAre(7, 7));
  EXPECT_THAT(layout->ulysses_recv_rows, ElementsAre(7, 4));
  EXPECT_THAT(layout->attention_lengths, ElementsAre(8, 3));
  EXPECT_EQ(layout->attention_rows, 11);
  EXPECT_THAT(AttentionIndex(layout->ulysses_recv_rows, plan.ulysses),
              ElementsAre(0, 1, 2, 3, 4, 7, 8, 9, 5, 6, 10));
}

// What a hostile plan claims about the peers must not size anything before
// they confirm it: the rank's own position is checked against its chunks.
TEST(RouteLayout, ABagWhoseOwnPositionIsNotWhatTheRankComputesOnIsRefused) {
  RankPlan plan = TwoRankPlan();
  plan.ulysses.gpus = 2;
  plan.ulysses.sequences = {{0, 0, int64_t{1} << 40, {6, (int64_t{1} << 40) - 6}}};
  EXPECT_EQ(DeriveRouteLayout(plan, {3, 2}, 0, 2, 2, 0).status().message(),
            "plan: rank 0's bag lists 6 tokens at its position but it computes on 7");
}

TEST(RouteLayout, CountsThatOverflowAreRefused) {
  RankPlan plan = TwoRankPlan();
  plan.ulysses.gpus = 2;
  const int64_t huge = std::numeric_limits<int64_t>::max() - 2;
  plan.ulysses.sequences = {{0, 0, 7, {7, 0}}, {1, 0, huge, {0, huge}}, {1, 1, huge, {0, huge}}};
  EXPECT_EQ(DeriveRouteLayout(plan, {3, 2}, 0, 2, 2, 0).status().message(),
            "plan: rank 0's Ulysses chunks overflow 64 bits");
  plan = TwoRankPlan();
  plan.route.recvs = {{0, 0, 0, huge}, {1, 0, 0, huge}};
  plan.compute_chunk_lengths = {huge, huge};
  EXPECT_EQ(Derive(plan, {3, 2}).message(), "plan: rank 0's chunks overflow 64 bits");
}

TEST(RouteLayout, SendingTheSameTokensOverAndOverIsRefusedBeforeTheyAreListed) {
  RankPlan plan = TwoRankPlan();
  plan.route.sends.assign(1000000, Transfer{0, 0, 0, 3});  // 3 tokens, a million times
  EXPECT_EQ(Derive(plan, {3, 2}).message(), "plan: rank 0 is asked to send more than its 5 tokens");
}

TEST(RouteLayout, ABagThatIsNotThisRanksIsRefused) {
  RankPlan plan = TwoRankPlan();
  EXPECT_EQ(Derive(plan, {3, 2}, /*bag_gpus=*/2).message(),
            "plan: rank 0 is in the bag of 2 GPUs from rank 0, the plan says 1 from 0");
  plan.ulysses.gpus = 2;
  plan.ulysses.sequences = {{0, 0, 5, {3, 2, 0}}};
  EXPECT_THAT(std::string(Derive(plan, {3, 2}, 2).message()),
              HasSubstr("has 3 chunk lengths for 2 GPUs"));
  plan.ulysses.sequences = {{0, 0, 5, {3, 1}}};
  EXPECT_THAT(std::string(Derive(plan, {3, 2}, 2).message()),
              HasSubstr("a sequence of 5 tokens in rank 0's bag has chunks of 4"));
}

}  // namespace
}  // namespace knapformer
