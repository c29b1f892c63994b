// The in-process transport: uneven all-to-all against hand-computed rows,
// count mismatches, all-gather, subgroups and a missing rank.
#include "transport/local_transport.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Runs fn(rank, transport) on one thread per rank.
template <typename Fn>
void RunRanks(std::vector<std::unique_ptr<LocalTransport>>& group, Fn fn) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { fn(static_cast<int>(r), *group[r]); });
  }
  for (std::thread& t : threads) t.join();
}

TEST(LocalTransportTest, AllToAllMovesUnevenRowsToTheRightPlaces) {
  // Rank s sends (s + d) % 3 rows to rank d; row values encode (s, d, i).
  const int n = 3;
  auto group = LocalTransport::CreateGroup(n);
  std::vector<std::vector<int32_t>> received(n);
  std::vector<absl::Status> status(n);
  RunRanks(group, [&](int s, LocalTransport& t) {
    std::vector<int64_t> send_rows(n), recv_rows(n);
    std::vector<int32_t> send;
    for (int d = 0; d < n; ++d) {
      send_rows[d] = (s + d) % 3;
      recv_rows[d] = (d + s) % 3;
      for (int i = 0; i < send_rows[d]; ++i) send.push_back(100 * s + 10 * d + i);
    }
    int64_t total = 0;
    for (int64_t rows : recv_rows) total += rows;
    received[s].assign(total, -1);
    status[s] = t.AllToAll(send.data(), send_rows, received[s].data(), recv_rows, sizeof(int32_t));
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  // Rank 0 gets 0 rows from rank 0, 1 from rank 1 (value 100*1 + 10*0 + 0),
  // 2 from rank 2; and so on.
  EXPECT_THAT(received[0], ElementsAre(100, 200, 201));
  EXPECT_THAT(received[1], ElementsAre(10, 110, 111));
  EXPECT_THAT(received[2], ElementsAre(20, 21, 220));
}

TEST(LocalTransportTest, FlaggedExchangeCarriesEveryRanksFlagWithTheRows) {
  const int n = 3;
  auto group = LocalTransport::CreateGroup(n);
  std::vector<std::vector<int32_t>> received(n);
  std::vector<std::vector<uint8_t>> flags(n);
  std::vector<absl::Status> status(n);
  RunRanks(group, [&](int s, LocalTransport& t) {
    std::vector<int64_t> send_rows(n), recv_rows(n);
    std::vector<int32_t> send;
    for (int d = 0; d < n; ++d) {
      send_rows[d] = (s + d) % 3;
      recv_rows[d] = (d + s) % 3;
      for (int i = 0; i < send_rows[d]; ++i) send.push_back(100 * s + 10 * d + i);
    }
    received[s].assign(3, -1);
    status[s] = t.AllToAll(send.data(), send_rows, received[s].data(), recv_rows, sizeof(int32_t),
                           AllToAllOptions::Flagged(static_cast<uint8_t>(s * 2), &flags[s]));
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_THAT(flags[r], ElementsAre(0, 2, 4));
  }
  EXPECT_THAT(received[0], ElementsAre(100, 200, 201));
  EXPECT_THAT(received[2], ElementsAre(20, 21, 220));
}

TEST(LocalTransportTest, SegmentsPairUpInOrderAndAWrongSizeIsAnError) {
  const int n = 3;
  auto group = LocalTransport::CreateGroup(n);
  std::vector<std::vector<int32_t>> first(n), second(n);
  std::vector<std::vector<uint8_t>> flags(n);
  std::vector<absl::Status> status(n);
  RunRanks(group, [&](int s, LocalTransport& t) {
    // To each peer two segments: [s, d] then [10 s + d] (rank 2 sends rank 0 a
    // first segment of 3 values where rank 0 expects 2: an error there).
    std::vector<std::vector<int32_t>> out;
    out.reserve(2 * n);
    std::vector<SendSegment> sends;
    std::vector<RecvSegment> recvs;
    first[s].assign(2 * n, -1);
    second[s].assign(n, -1);
    for (int d = 0; d < n; ++d) {
      if (d == s) continue;
      out.push_back(s == 2 && d == 0 ? std::vector<int32_t>{s, d, 99} : std::vector<int32_t>{s, d});
      sends.push_back({d, out.back().data(), static_cast<int64_t>(out.back().size() * 4)});
      recvs.push_back({d, &first[s][2 * d], 8});
    }
    for (int d = 0; d < n; ++d) {
      if (d == s) continue;
      out.push_back({10 * s + d});
      sends.push_back({d, out.back().data(), 4});
      recvs.push_back({d, &second[s][d], 4});
    }
    status[s] =
        t.AllToAll(nullptr, {}, nullptr, {}, 0,
                   AllToAllOptions::Segments(&sends, &recvs, static_cast<uint8_t>(s), &flags[s]));
  });
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("rank 2"));
  for (int r = 1; r < n; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_THAT(flags[r], ElementsAre(0, 1, 2));
  }
  EXPECT_THAT(first[1], ElementsAre(0, 1, -1, -1, 2, 1));
  EXPECT_THAT(second[1], ElementsAre(1, -1, 21));
  EXPECT_THAT(first[2], ElementsAre(0, 2, 1, 2, -1, -1));
}

TEST(LocalTransportTest, ACountMismatchIsAnErrorNamingBothRanks) {
  auto group = LocalTransport::CreateGroup(2);
  std::vector<absl::Status> status(2);
  RunRanks(group, [&](int r, LocalTransport& t) {
    const int64_t value[2] = {r, r};
    int64_t out[4];
    // Rank 1 expects 2 rows from rank 0, which sends it 1.
    std::vector<int64_t> recv_rows = r == 1 ? std::vector<int64_t>{2, 1}
                                            : std::vector<int64_t>{1, 1};
    status[r] = t.AllToAll(value, {1, 1}, out, recv_rows, sizeof(int64_t));
  });
  EXPECT_TRUE(status[0].ok());
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status[1].message()),
              HasSubstr("rank 1 expects 2 rows from rank 0, which sends 1"));
}

// Transport's own CheckRowCounts (built on AllToAllRows and AllGatherBytes):
// every rank gets the first disagreement, not only the rank that saw it.
TEST(LocalTransportTest, CheckRowCountsGivesEveryRankTheSameError) {
  auto group = LocalTransport::CreateGroup(3);
  std::vector<absl::Status> agree(3), disagree(3);
  RunRanks(group, [&](int r, LocalTransport& t) {
    // Rank r sends r + p rows to rank p.
    std::vector<int64_t> send_rows = {r + 0, r + 1, r + 2};
    std::vector<int64_t> recv_rows = {0 + r, 1 + r, 2 + r};
    agree[r] = t.CheckRowCounts(send_rows, recv_rows);
    if (r == 2) recv_rows[1] = 7;  // rank 2 expects 7 from rank 1, which sends 3
    if (r == 1) recv_rows[0] = 9;  // and rank 1 expects 9 from rank 0, which sends 1
    disagree[r] = t.CheckRowCounts(send_rows, recv_rows);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(agree[r].ok()) << agree[r];
    EXPECT_EQ(disagree[r].code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(disagree[r].message(), "recv_rows: rank 1 expects 9 rows from rank 0, which sends it 1");
  }
}

TEST(LocalTransportTest, BroadcastGivesEveryRankTheRootsBytes) {
  auto group = LocalTransport::CreateGroup(3);
  std::vector<std::string> got(3);
  std::vector<absl::Status> bad_root(3);
  RunRanks(group, [&](int r, LocalTransport& t) {
    bad_root[r] = t.BroadcastBytes(-1, "x").status();
    auto all = t.BroadcastBytes(2, std::string(r + 1, 'a' + r));
    ASSERT_TRUE(all.ok()) << all.status();
    got[r] = *all;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], "ccc");
    EXPECT_EQ(bad_root[r].message(), "root: -1 is outside the group's ranks [0, 3)");
  }
}

TEST(LocalTransportTest, AllGatherAndSubgroups) {
  auto group = LocalTransport::CreateGroup(4);
  std::vector<std::vector<std::string>> gathered(4);
  std::vector<std::vector<std::string>> sub_gathered(4);
  RunRanks(group, [&](int r, LocalTransport& t) {
    auto all = t.AllGatherBytes(std::string(r + 1, 'a' + r));
    ASSERT_TRUE(all.ok());
    gathered[r] = *all;
    const std::vector<int> members = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto sub = t.Subgroup(members);
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ((*sub)->size(), 2);
    EXPECT_EQ((*sub)->rank(), r / 2);
    auto in_sub = (*sub)->AllGatherBytes(std::to_string(r));
    ASSERT_TRUE(in_sub.ok());
    sub_gathered[r] = *in_sub;
  });
  for (int r = 0; r < 4; ++r) EXPECT_THAT(gathered[r], ElementsAre("a", "bb", "ccc", "dddd"));
  EXPECT_THAT(sub_gathered[0], ElementsAre("0", "2"));
  EXPECT_THAT(sub_gathered[3], ElementsAre("1", "3"));
  auto not_member = group[0]->Subgroup({1, 2});
  EXPECT_EQ(not_member.status().code(), absl::StatusCode::kInvalidArgument);
  auto unsorted = group[0]->Subgroup({2, 0});
  EXPECT_EQ(unsorted.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LocalTransportTest, AMissingRankIsDeadlineExceededNamingIt) {
  auto group = LocalTransport::CreateGroup(3, absl::Milliseconds(100));
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (int r : {0, 2}) {
    threads.emplace_back([&, r] { status[r] = group[r]->AllGatherBytes("x").status(); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(status[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("for ranks 1"));
}

}  // namespace
}  // namespace knapformer
