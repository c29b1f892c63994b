// The row-count verdicts every backend uses (agreement.h) and the single
// error every rank derives from them, and the raw NCCL transport's send/recv
// pairs of an all-to-all, on the CPU.
#include "transport/exchange_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

// Every rank's verdict for a 3-rank exchange where rank r sends rows[r][p]
// to p and expects expected[r][p] from p.
std::vector<int64_t> Verdicts(const std::vector<std::vector<int64_t>>& rows,
                              const std::vector<std::vector<int64_t>>& expected,
                              const std::vector<int64_t>& row_bytes) {
  const int n = static_cast<int>(rows.size());
  std::vector<int64_t> all;
  for (int r = 0; r < n; ++r) {
    std::vector<int64_t> sent_to_me(n);
    for (int p = 0; p < n; ++p) sent_to_me[p] = rows[p][r];
    const std::vector<int64_t> v = CountVerdict(r, n, sent_to_me, expected[r], row_bytes[r]);
    EXPECT_EQ(v.size(), static_cast<size_t>(kVerdictFields));
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

const std::vector<std::vector<int64_t>> kRows = {{0, 2, 1}, {3, 0, 0}, {1, 1, 4}};
// Transposed: what each rank expects from each peer.
const std::vector<std::vector<int64_t>> kExpected = {{0, 3, 1}, {2, 0, 1}, {1, 0, 4}};

TEST(ExchangePlan, AgreeingCountsPass) {
  EXPECT_TRUE(JudgeVerdicts(Verdicts(kRows, kExpected, {8, 8, 8}), 3).ok());
}

TEST(ExchangePlan, TheSmallestDisagreementIsEveryRanksError) {
  auto expected = kExpected;
  expected[2][1] = 5;  // rank 2 expects 5 from rank 1, which sends 1
  expected[1][0] = 7;  // rank 1 expects 7 from rank 0, which sends 2: first
  absl::Status status = JudgeVerdicts(Verdicts(kRows, expected, {8, 8, 8}), 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "recv_rows: rank 1 expects 7 rows from rank 0, which sends it 2");
}

TEST(ExchangePlan, DifferentRowSizesComeFirst) {
  auto expected = kExpected;
  expected[0][1] = 9;
  absl::Status status = JudgeVerdicts(Verdicts(kRows, expected, {8, 8, 4}), 3);
  EXPECT_EQ(status.message(), "row_bytes: rank 0 moves rows of 8 bytes, rank 2 of 4");
}

TEST(ExchangePlan, ARefusingRankFailsEveryRank) {
  std::vector<int64_t> verdicts = Verdicts(kRows, kExpected, {8, 8, 8});
  const std::vector<int64_t> refusal = RefusingVerdict(1, 3);
  std::copy(refusal.begin(), refusal.end(), verdicts.begin() + kVerdictFields);
  absl::Status status = JudgeVerdicts(verdicts, 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), testing::HasSubstr("rank 1 refused"));
}

TEST(ExchangePlan, VerdictsFromOutsideTheGroupAreRefusedBeforeTheyAreRead) {
  std::vector<int64_t> verdicts = Verdicts(kRows, kExpected, {8, 8, 8});
  verdicts.pop_back();
  EXPECT_EQ(JudgeVerdicts(verdicts, 3).code(), absl::StatusCode::kInternal);
  for (const int64_t pair : {int64_t{-1}, int64_t{9}}) {  // 3 x 3 pairs: 0..8
    verdicts = Verdicts(kRows, kExpected, {8, 8, 8});
    verdicts[kVerdictFields] = pair;  // rank 1's pair
    absl::Status status = JudgeVerdicts(verdicts, 3);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(status.message()),
                testing::HasSubstr("rank 1 names rank pair " + std::to_string(pair)));
  }
  verdicts = Verdicts(kRows, kExpected, {8, 8, 8});
  verdicts[2 * kVerdictFields + 3] = -2;  // rank 2's row size
  EXPECT_THAT(std::string(JudgeVerdicts(verdicts, 3).message()),
              testing::HasSubstr("rank 2 sent a row size of -2"));
}

TEST(ExchangePlan, PeerTransfersSkipEmptyPairsAndKeepOffsets) {
  const std::vector<PeerTransfer> t = PeerTransfers({2, 0, 3, 0}, {1, 0, 0, 4}, 5);
  ASSERT_EQ(t.size(), 3u);  // peer 1 moves nothing either way
  EXPECT_EQ(t[0].peer, 0);
  EXPECT_EQ(t[0].send_offset, 0);
  EXPECT_EQ(t[0].send_bytes, 10);
  EXPECT_EQ(t[0].recv_bytes, 5);
  EXPECT_EQ(t[1].peer, 2);
  EXPECT_EQ(t[1].send_offset, 10);
  EXPECT_EQ(t[1].send_bytes, 15);
  EXPECT_EQ(t[1].recv_offset, 5);
  EXPECT_EQ(t[1].recv_bytes, 0);
  EXPECT_EQ(t[2].peer, 3);
  EXPECT_EQ(t[2].send_bytes, 0);
  EXPECT_EQ(t[2].recv_offset, 5);
  EXPECT_EQ(t[2].recv_bytes, 20);
  EXPECT_TRUE(PeerTransfers({0, 0}, {0, 0}, 8).empty());
}

}  // namespace
}  // namespace knapformer
