// The typed agreement layer (transport/agreement.h) over the in-process
// transport: every rank returns the same status, whatever a peer sent.
#include "transport/agreement.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/local_transport.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

// fn(rank, transport) on one thread per rank; each rank's status, by rank.
template <typename Fn>
std::vector<absl::Status> OnEveryRank(int size, Fn fn) {
  auto group = LocalTransport::CreateGroup(size, absl::Seconds(10));
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { statuses[r] = fn(r, *group[r]); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

void ExpectTheSameOnEveryRank(const std::vector<absl::Status>& statuses) {
  for (size_t r = 1; r < statuses.size(); ++r) EXPECT_EQ(statuses[r], statuses[0]) << "rank " << r;
}

TEST(Agreement, TheLowestFailingRanksStatusIsEveryRanks) {
  // Messages are bytes: one that is not UTF-8 arrives as it was sent.
  const std::string why = "bad input \xff";
  auto statuses = OnEveryRank(4, [&](int rank, Transport& t) {
    if (rank == 2) return AgreeOnStatus(t, absl::InvalidArgumentError(why));
    if (rank == 3) return AgreeOnStatus(t, absl::NotFoundError("later rank"));
    return AgreeOnStatus(t, absl::OkStatus());
  });
  ExpectTheSameOnEveryRank(statuses);
  EXPECT_EQ(statuses[0], absl::InvalidArgumentError("rank 2: " + why));

  statuses = OnEveryRank(3, [&](int rank, Transport& t) {
    return AgreeOnStatus(t, rank == 1 ? absl::AbortedError("names itself") : absl::OkStatus(),
                         -1, NameRank::kNo);
  });
  ExpectTheSameOnEveryRank(statuses);
  EXPECT_EQ(statuses[0], absl::AbortedError("names itself"));

  statuses = OnEveryRank(3, [&](int, Transport& t) { return AgreeOnStatus(t, absl::OkStatus()); });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST(Agreement, DifferentRowSizesAreEveryRanksError) {
  auto statuses = OnEveryRank(3, [&](int rank, Transport& t) {
    return AgreeOnStatus(t, absl::OkStatus(), rank == 2 ? 4 : 8);
  });
  ExpectTheSameOnEveryRank(statuses);
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("rows of 8 bytes on rank 0 but 4 on rank 2"));
}

TEST(Agreement, BytesThatAreNotTheMessageNameTheRankOnEveryRank) {
  auto statuses = OnEveryRank(3, [&](int rank, Transport& t) -> absl::Status {
    // Rank 1 sends a truncated field: not a Verdict.
    if (rank == 1) return t.AllGatherBytes(std::string("\x08", 1)).status();
    return AgreeOnStatus(t, absl::OkStatus());
  });
  EXPECT_EQ(statuses[0], Malformed(1, "knapformer.agreement.Verdict"));
  EXPECT_EQ(statuses[0].code(), absl::StatusCode::kInternal);
  EXPECT_EQ(statuses[2], statuses[0]);
}

TEST(Agreement, EveryDecodedCodeAndRowSizeIsChecked) {
  agreement::Verdict verdict = VerdictOf(absl::OkStatus());
  EXPECT_TRUE(CheckVerdict(verdict, 0).ok());
  for (const int code : {-1, 17, 1 << 20}) {
    verdict.set_code(code);
    const absl::Status status = StatusOf(verdict, 5);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << code;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("rank 5 sent status code " + std::to_string(code)));
  }
  verdict = VerdictOf(absl::OkStatus(), 16);
  EXPECT_TRUE(CheckVerdict(verdict, 0).ok());
  verdict.set_row_bytes(-3);
  EXPECT_THAT(std::string(CheckVerdict(verdict, 2).message()),
              HasSubstr("rank 2 sent a row size of -3 bytes"));
  EXPECT_EQ(FirstFailure({VerdictOf(absl::OkStatus(), 8), verdict}).code(),
            absl::StatusCode::kInternal);
  // Every absl code round-trips.
  for (int code = 1; code <= 16; ++code) {
    const absl::Status sent(static_cast<absl::StatusCode>(code), "why");
    EXPECT_EQ(StatusOf(VerdictOf(sent), 0, "rank 0: "),
              absl::Status(sent.code(), "rank 0: why"));
  }
}

TEST(Agreement, BroadcastGivesEveryRankTheRootsMessage) {
  auto statuses = OnEveryRank(3, [&](int rank, Transport& t) -> absl::Status {
    absl::StatusOr<agreement::Verdict> got =
        BroadcastMessage(t, 2, VerdictOf(absl::UnavailableError(absl::StrCat("from ", rank)), 4));
    if (!got.ok()) return got.status();
    return StatusOf(*got, 2);
  });
  ExpectTheSameOnEveryRank(statuses);
  EXPECT_EQ(statuses[0], absl::UnavailableError("from 2"));

  statuses = OnEveryRank(2, [&](int, Transport& t) {
    return BroadcastMessage(t, 2, VerdictOf(absl::OkStatus())).status();
  });
  for (const absl::Status& s : statuses) EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace knapformer
