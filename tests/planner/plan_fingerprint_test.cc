// Per-rank mode's cross-rank check of the shares of a plan: the slices of
// one plan agree; a share with two receive chunk lengths swapped (totals
// kept), a bag member with another chunk table, another mask or another bag
// is found from the fingerprints alone.
#include "planner/plan_fingerprint.h"

#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kRanks = 8;

struct Shares {
  std::vector<RankPlan> plans;
  RankMasks masks;
};

// One plan of g1n2+g2n1+g4n1 on 8 ranks, with masks when `masked`, sliced.
Shares Sliced(bool masked) {
  RankLengths lengths = {{300, 20, 7}, {5}, {900, 40}, {}, {60, 60, 60}, {2000}, {11}, {130, 1}};
  RankMasks masks;
  if (masked) {
    for (const auto& rank : lengths) {
      std::vector<AttentionMask> mine;
      for (size_t i = 0; i < rank.size(); ++i) {
        mine.push_back(i % 2 == 0 ? AttentionMask::Causal() : AttentionMask::Window(3));
      }
      masks.push_back(mine);
    }
  }
  auto world = World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), kRanks);
  auto plan = BalanceGreedy(*world, *CostModel::Create(64, 0.5), lengths, BalancerOptions(),
                            masked ? &masks : nullptr);
  EXPECT_TRUE(plan.ok()) << plan.status();
  Shares shares;
  for (int32_t r = 0; r < kRanks; ++r) shares.plans.push_back(plan->Slice(r));
  shares.masks = masks;
  return shares;
}

std::vector<PlanFingerprint> Fingerprints(const Shares& shares) {
  std::vector<PlanFingerprint> all;
  for (int32_t r = 0; r < kRanks; ++r) {
    all.push_back(FingerprintOf(shares.plans[r],
                                shares.masks.empty() ? std::vector<AttentionMask>()
                                                     : shares.masks[r]));
  }
  return all;
}

TEST(PlanFingerprintTest, TheSlicesOfOnePlanAgree) {
  for (bool masked : {false, true}) {
    const Shares shares = Sliced(masked);
    EXPECT_TRUE(CheckFingerprints(Fingerprints(shares)).ok())
        << "masked " << masked << ": " << CheckFingerprints(Fingerprints(shares));
  }
}

TEST(PlanFingerprintTest, TwoReceiveChunkLengthsSwappedWithTheirTotalKeptDisagree) {
  Shares shares = Sliced(false);
  // A rank that receives two or more chunks: swap the first two lengths.
  bool swapped = false;
  for (RankPlan& plan : shares.plans) {
    std::vector<Transfer>& recvs = plan.route.recvs;
    for (size_t i = 0; i + 1 < recvs.size() && !swapped; ++i) {
      if (recvs[i].length != recvs[i + 1].length) {
        std::swap(recvs[i].length, recvs[i + 1].length);
        swapped = true;
      }
    }
    if (swapped) break;
  }
  ASSERT_TRUE(swapped) << "the plan has no rank receiving two chunks of different lengths";
  const absl::Status status = CheckFingerprints(Fingerprints(shares));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("disagree on the route"));
}

TEST(PlanFingerprintTest, ASendersOffsetOrSequenceDisagrees) {
  Shares shares = Sliced(false);
  ASSERT_FALSE(shares.plans[5].route.sends.empty());  // 2000 tokens do not stay on rank 5
  shares.plans[5].route.sends[0].offset += 1;
  EXPECT_THAT(std::string(CheckFingerprints(Fingerprints(shares)).message()),
              HasSubstr("disagree on the route"));
}

TEST(PlanFingerprintTest, ABagMemberWithAnotherChunkTableDisagrees) {
  Shares shares = Sliced(false);
  // Ranks 4..7 are the 4-GPU bag.
  RankPlan& member = shares.plans[6];
  ASSERT_EQ(member.ulysses.gpus, 4);
  ASSERT_FALSE(member.ulysses.sequences.empty());
  std::vector<int64_t>& chunks = member.ulysses.sequences[0].chunk_lengths;
  ASSERT_GE(chunks.size(), 2u);
  chunks[0] += 1;
  chunks[1] -= 1;
  const absl::Status status = CheckFingerprints(Fingerprints(shares));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("disagree on the bag of ranks 4..7: rank 6's view of its members, chunk "
                        "table or masks differs from rank 4's"));
}

TEST(PlanFingerprintTest, ABagMemberWithAnotherMaskDisagrees) {
  Shares shares = Sliced(true);
  RankPlan& member = shares.plans[5];
  ASSERT_FALSE(member.attention_masks.empty());
  member.attention_masks[0] = AttentionMask::Full();
  EXPECT_FALSE(CheckFingerprints(Fingerprints(shares)).ok());
}

TEST(PlanFingerprintTest, AShareThatPutsItsRankInAnotherBagDisagrees) {
  Shares shares = Sliced(false);
  shares.plans[3].ulysses.first_rank = 0;  // rank 3 is in the 2-GPU bag {2, 3}
  const absl::Status status = CheckFingerprints(Fingerprints(shares));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("put rank 3 in a bag of ranks 0..1, which does not hold it"));
}

}  // namespace
}  // namespace knapformer
