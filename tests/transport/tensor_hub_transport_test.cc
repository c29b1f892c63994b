// The tensor hub transport on CPU tensors (its GPU use is the GPU check's
// hub_layout): uneven all-to-all against hand-computed rows, straight from
// the peers' buffers; a count mismatch refused alike on every rank with
// nothing copied; all-gather, subgroups, and the device it reports.
#include "transport/tensor_hub_transport.h"

#include <thread>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/local_transport.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename Fn>
void RunRanks(std::vector<std::unique_ptr<TensorHubTransport>>& group, Fn fn) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { fn(static_cast<int>(r), *group[r]); });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<int32_t> Values(const at::Tensor& t) {
  const int32_t* p = t.data_ptr<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

TEST(TensorHubTransportTest, AllToAllMovesUnevenRowsOfTensorsToTheRightPlaces) {
  // Rank s sends (s + d) % 3 rows of two int32 to rank d; values encode (s, d, i).
  const int n = 3;
  auto group = TensorHubTransport::CreateGroup(n, c10::Device(c10::kCPU));
  std::vector<at::Tensor> received(n);
  std::vector<absl::Status> status(n);
  RunRanks(group, [&](int s, TensorHubTransport& t) {
    std::vector<int64_t> send_rows(n), recv_rows(n);
    std::vector<int32_t> values;
    for (int d = 0; d < n; ++d) {
      send_rows[d] = (s + d) % 3;
      recv_rows[d] = (d + s) % 3;
      for (int i = 0; i < send_rows[d]; ++i) {
        values.push_back(100 * s + 10 * d + i);
        values.push_back(-(100 * s + 10 * d + i));
      }
    }
    const at::Tensor send = at::tensor(values, at::kInt).view({-1, 2});
    int64_t total = 0;
    for (int64_t rows : recv_rows) total += rows;
    received[s] = at::full({total, 2}, 7, at::kInt);
    status[s] = t.AllToAll(send.data_ptr(), send_rows, received[s].data_ptr(), recv_rows,
                           2 * sizeof(int32_t));
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  EXPECT_THAT(Values(received[0]), ElementsAre(100, -100, 200, -200, 201, -201));
  EXPECT_THAT(Values(received[1]), ElementsAre(10, -10, 110, -110, 111, -111));
  EXPECT_THAT(Values(received[2]), ElementsAre(20, -20, 21, -21, 220, -220));
  EXPECT_EQ(group[0]->cuda_device(), -1);
}

TEST(TensorHubTransportTest, CountMismatchIsTheSameErrorEverywhereAndCopiesNothing) {
  const int n = 2;
  auto group = TensorHubTransport::CreateGroup(n, c10::Device(c10::kCPU));
  std::vector<at::Tensor> received(n);
  std::vector<absl::Status> status(n);
  RunRanks(group, [&](int s, TensorHubTransport& t) {
    const at::Tensor send = at::arange(4, at::kInt);
    // Rank 1 expects 3 rows from rank 0, which sends it 2.
    const std::vector<int64_t> send_rows = {2, 2};
    const std::vector<int64_t> recv_rows = s == 1 ? std::vector<int64_t>{3, 2}
                                                  : std::vector<int64_t>{2, 2};
    received[s] = at::full({5}, 7, at::kInt);
    status[s] =
        t.AllToAll(send.data_ptr(), send_rows, received[s].data_ptr(), recv_rows, sizeof(int32_t));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument) << status[r];
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("rank 1 expects 3 rows from rank 0"));
    EXPECT_TRUE(at::equal(received[r], at::full({5}, 7, at::kInt))) << "rank " << r;
  }
  // The transport is still usable.
  std::vector<std::vector<std::string>> gathered(n);
  RunRanks(group, [&](int s, TensorHubTransport& t) {
    gathered[s] = t.AllGatherBytes(std::string(1, static_cast<char>('a' + s))).value();
  });
  EXPECT_THAT(gathered[1], ElementsAre("a", "b"));
}

// CheckRowCounts compares counts on the host (a GPU hub cannot copy host
// memory, which the base class's check moves): the same verdict, on every
// rank, as the base class's check over a host transport, for counts that
// agree and for mismatches at several receivers and senders.
TEST(TensorHubTransportTest, CheckRowCountsGivesTheBaseClassVerdictOnEveryRank) {
  const int n = 3;
  // recv_rows of rank r: what rank p sends it is (p + 2 * r) % 4, except
  // where a case changes one count.
  struct Case {
    int receiver, sender;  // -1: no change
    int64_t expected;
  };
  for (const Case& c : {Case{-1, -1, 0}, Case{2, 0, 9}, Case{1, 2, 3}, Case{0, 0, 5}}) {
    auto counts = [&](int r, std::vector<int64_t>* send_rows, std::vector<int64_t>* recv_rows) {
      send_rows->assign(n, 0);
      recv_rows->assign(n, 0);
      for (int p = 0; p < n; ++p) {
        (*send_rows)[p] = (r + 2 * p) % 4;
        (*recv_rows)[p] = (p + 2 * r) % 4;
      }
      if (r == c.receiver) (*recv_rows)[c.sender] = c.expected;
      // A second mismatch at a later receiver, which the verdict must not name.
      if (c.receiver >= 0 && r == n - 1 && c.receiver != n - 1) (*recv_rows)[1] += 1;
    };
    std::vector<absl::Status> hub(n), base(n);
    auto hubs = TensorHubTransport::CreateGroup(n, c10::Device(c10::kCPU));
    RunRanks(hubs, [&](int r, TensorHubTransport& t) {
      std::vector<int64_t> send_rows, recv_rows;
      counts(r, &send_rows, &recv_rows);
      hub[r] = t.CheckRowCounts(send_rows, recv_rows);
    });
    auto hosts = LocalTransport::CreateGroup(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        std::vector<int64_t> send_rows, recv_rows;
        counts(r, &send_rows, &recv_rows);
        base[r] = hosts[r]->CheckRowCounts(send_rows, recv_rows);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(hub[r], base[r]) << "case receiver " << c.receiver << ", rank " << r;
      EXPECT_EQ(hub[r].ok(), c.receiver < 0) << hub[r];
      if (c.receiver >= 0) {
        EXPECT_THAT(std::string(hub[r].message()),
                    HasSubstr(absl::StrCat("rank ", c.receiver, " expects ", c.expected,
                                           " rows from rank ", c.sender)));
      }
    }
  }
}

TEST(TensorHubTransportTest, SubgroupsExchangeAmongTheirRanks) {
  const int n = 4;
  auto group = TensorHubTransport::CreateGroup(n, c10::Device(c10::kCPU));
  std::vector<at::Tensor> received(n);
  RunRanks(group, [&](int s, TensorHubTransport& t) {
    const std::vector<int> ranks = s < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    std::unique_ptr<Transport> sub = t.Subgroup(ranks).value();
    ASSERT_EQ(sub->size(), 2);
    ASSERT_EQ(sub->rank(), s % 2);
    const at::Tensor send = at::tensor({10 * s, 10 * s + 1}, at::kInt);
    received[s] = at::empty({2}, at::kInt);
    ASSERT_TRUE(
        sub->AllToAll(send.data_ptr(), {1, 1}, received[s].data_ptr(), {1, 1}, sizeof(int32_t))
            .ok());
  });
  EXPECT_THAT(Values(received[0]), ElementsAre(0, 10));
  EXPECT_THAT(Values(received[1]), ElementsAre(1, 11));
  EXPECT_THAT(Values(received[3]), ElementsAre(21, 31));
}

}  // namespace
}  // namespace knapformer
