// The raw NCCL transport on 2 CUDA devices, one thread per rank (NCCL allows
// ranks of one communicator in threads of one process, one device each).
// Built for real only under --config=cuda; the device tests skip, visibly,
// where there are fewer than 2 CUDA devices.
#include "gtest/gtest.h"

#if defined(KNAPFORMER_HAVE_NCCL)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gmock/gmock.h"
#include "transport/nccl_transport.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kRanks = 2;
constexpr int kRowBytes = 3;

std::string CudaError(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + " (" + cudaGetErrorString(error) + ")";
}

// Why this machine cannot run the device tests, or "" when it can.
std::string WhyNoDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess)
    return "no CUDA device: cudaGetDeviceCount returned " + CudaError(error);
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found 0";
  if (count < kRanks) {
    return "needs " + std::to_string(kRanks) +
           " CUDA devices (NCCL runs one rank per device), found " + std::to_string(count);
  }
  return "";
}

// A device buffer on the current device, filled from / read back to host.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<uint8_t>& host) : size_(host.size()) {
    if (size_ == 0) return;
    EXPECT_EQ(cudaMalloc(&data_, size_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  void* data() { return data_; }
  std::vector<uint8_t> ToHost() const {
    std::vector<uint8_t> host(size_);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, size_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  void* data_ = nullptr;
  size_t size_;
};

using RankBody = std::function<void(int rank, NcclTransport& transport)>;

// Runs `body` as ranks 0..kRanks-1 of a new communicator, rank r on device
// r in its own thread with its own stream.
void RunRanks(const RankBody& body) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      {
        auto transport = NcclTransport::CreateFromUniqueId(id, rank, kRanks, rank, stream);
        ASSERT_TRUE(transport.ok()) << "rank " << rank << ": " << transport.status();
        EXPECT_EQ((*transport)->rank(), rank);
        EXPECT_EQ((*transport)->size(), kRanks);
        body(rank, **transport);
      }
      EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

class NcclTransportDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = WhyNoDevices();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// Rows, hand-computed: rank 0 sends 1 row to itself and 3 to rank 1; rank 1
// sends 2 rows to rank 0 and none to itself. Each row is (from, to, index).
const std::vector<std::vector<int64_t>> kSendRows = {{1, 3}, {2, 0}};
const std::vector<std::vector<int64_t>> kRecvRows = {{1, 2}, {3, 0}};
const std::vector<std::vector<uint8_t>> kSend = {
    {0, 0, 0, /**/ 0, 1, 0, 0, 1, 1, 0, 1, 2},
    {1, 0, 0, 1, 0, 1},
};
const std::vector<std::vector<uint8_t>> kExpected = {
    {0, 0, 0, /**/ 1, 0, 0, 1, 0, 1},
    {0, 1, 0, 0, 1, 1, 0, 1, 2},
};

TEST_F(NcclTransportDeviceTest, UnevenAllToAllMovesEveryRowToItsPlace) {
  RunRanks([](int rank, NcclTransport& transport) {
    for (int round = 0; round < 3; ++round) {  // the group stays usable
      DeviceBytes send(kSend[rank]);
      DeviceBytes recv(std::vector<uint8_t>(kExpected[rank].size(), 0xEE));
      absl::Status status =
          transport.AllToAll(send.data(), kSendRows[rank], recv.data(), kRecvRows[rank], kRowBytes);
      ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status;
      EXPECT_EQ(recv.ToHost(), kExpected[rank]) << "rank " << rank << " round " << round;
    }
    // Nothing at all to move is a valid exchange too, with null buffers.
    const std::vector<int64_t> zeros(kRanks, 0);
    EXPECT_TRUE(transport.AllToAll(nullptr, zeros, nullptr, zeros, kRowBytes).ok());
  });
}

TEST_F(NcclTransportDeviceTest, CountMismatchIsTheSameErrorOnEveryRank) {
  RunRanks([](int rank, NcclTransport& transport) {
    std::vector<int64_t> recv_rows = kRecvRows[rank];
    if (rank == 1) recv_rows[0] = 4;  // rank 0 sends it 3
    DeviceBytes send(kSend[rank]);
    DeviceBytes recv(std::vector<uint8_t>(4 * kRowBytes));
    absl::Status status =
        transport.AllToAll(send.data(), kSendRows[rank], recv.data(), recv_rows, kRowBytes);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), "recv_rows: rank 1 expects 4 rows from rank 0, which sends it 3")
        << "rank " << rank;
    // Refused before any row moved, on every rank: the group is still usable.
    DeviceBytes good(std::vector<uint8_t>(kExpected[rank].size()));
    ASSERT_TRUE(
        transport.AllToAll(send.data(), kSendRows[rank], good.data(), kRecvRows[rank], kRowBytes)
            .ok());
    EXPECT_EQ(good.ToHost(), kExpected[rank]);
  });
}

TEST_F(NcclTransportDeviceTest, DifferentRowSizesAreTheSameErrorOnEveryRank) {
  RunRanks([](int rank, NcclTransport& transport) {
    const std::vector<int64_t> one_each(kRanks, 1);
    DeviceBytes send(std::vector<uint8_t>(2 * 4));
    DeviceBytes recv(std::vector<uint8_t>(2 * 4));
    absl::Status status =
        transport.AllToAll(send.data(), one_each, recv.data(), one_each, rank == 0 ? 3 : 4);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message(), "row_bytes: rank 0 moves rows of 3 bytes, rank 1 of 4");
  });
}

TEST_F(NcclTransportDeviceTest, BadArgumentsMoveNothingAndFailEveryRankAlike) {
  RunRanks([](int rank, NcclTransport& transport) {
    std::vector<uint8_t> unused(16);
    DeviceBytes buffer(unused);
    EXPECT_EQ(transport.AllToAll(buffer.data(), {1}, buffer.data(), {1, 1}, 1).message(),
              "send_rows/recv_rows: 1/2 entries for a group of 2");
    EXPECT_EQ(transport.AllToAll(buffer.data(), {1, -1}, buffer.data(), {1, 1}, 1).message(),
              "send_rows[1]: -1 rows; must be >= 0");
    EXPECT_EQ(transport.AllToAll(buffer.data(), {1, 1}, buffer.data(), {1, 1}, -2).message(),
              "row_bytes: -2; must be >= 0");
    EXPECT_EQ(transport.AllToAll(nullptr, {1, 1}, buffer.data(), {1, 1}, 2).message(),
              "send: null, but 4 bytes are to move through it");
    // None of those moved a row: the group still works.
    auto all = transport.AllGatherBytes(std::to_string(rank));
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_THAT(*all, ElementsAre("0", "1"));
  });
}

TEST_F(NcclTransportDeviceTest, AllGatherOfDifferentSizes) {
  RunRanks([](int rank, NcclTransport& transport) {
    // Rank 0 empty, rank 1 seven bytes (with a NUL inside).
    const std::string mine = rank == 0 ? "" : std::string("ab\0cdef", 7);
    auto all = transport.AllGatherBytes(mine);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_THAT(*all, ElementsAre("", std::string("ab\0cdef", 7)));

    auto empty = transport.AllGatherBytes("");
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_THAT(*empty, ElementsAre("", ""));

    // Larger than anything before: the scratch buffer grows; the short
    // string must not pick up the long one's padding.
    const std::string big = rank == 0 ? std::string(1 << 20, 'x') : "yz";
    auto grown = transport.AllGatherBytes(big);
    ASSERT_TRUE(grown.ok()) << grown.status();
    ASSERT_EQ(grown->size(), 2u);
    EXPECT_EQ((*grown)[0], std::string(1 << 20, 'x'));
    EXPECT_EQ((*grown)[1], "yz");
  });
}

TEST_F(NcclTransportDeviceTest, SubgroupsNeedOnlyTheirMembers) {
  RunRanks([](int rank, NcclTransport& transport) {
    // Rank 0 alone makes a group of itself while rank 1 does not call at
    // all (ncclCommSplit would hang here).
    if (rank == 0) {
      auto alone = transport.Subgroup({0});
      ASSERT_TRUE(alone.ok()) << alone.status();
      EXPECT_EQ((*alone)->size(), 1);
      EXPECT_EQ((*alone)->rank(), 0);
      auto all = (*alone)->AllGatherBytes("solo");
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_THAT(*all, ElementsAre("solo"));
    }
    // Both ranks, twice (a new communicator each time).
    for (int round = 0; round < 2; ++round) {
      auto sub = transport.Subgroup({0, 1});
      ASSERT_TRUE(sub.ok()) << "rank " << rank << ": " << sub.status();
      EXPECT_EQ((*sub)->size(), 2);
      EXPECT_EQ((*sub)->rank(), rank);
      auto all = (*sub)->AllGatherBytes("r" + std::to_string(rank));
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_THAT(*all, ElementsAre("r0", "r1"));
      // One row of one byte to each member: sender * 10 + receiver.
      DeviceBytes send({static_cast<uint8_t>(rank * 10), static_cast<uint8_t>(rank * 10 + 1)});
      DeviceBytes recv({0xEE, 0xEE});
      ASSERT_TRUE((*sub)->AllToAll(send.data(), {1, 1}, recv.data(), {1, 1}, 1).ok());
      EXPECT_EQ(recv.ToHost(), (std::vector<uint8_t>{static_cast<uint8_t>(rank),
                                                     static_cast<uint8_t>(10 + rank)}));
    }
    EXPECT_EQ(transport.Subgroup({0, 1, 2}).status().message(),
              "ranks: [0,1,2] must be ascending ranks of a group of 2");
    EXPECT_EQ(
        transport.Subgroup({1 - rank}).status().message(),
        "ranks: [" + std::to_string(1 - rank) + "] does not contain rank " + std::to_string(rank));
    // The parent is untouched by its subgroups.
    auto parent = transport.AllGatherBytes(std::to_string(rank));
    ASSERT_TRUE(parent.ok()) << parent.status();
    EXPECT_THAT(*parent, ElementsAre("0", "1"));
  });
}

TEST_F(NcclTransportDeviceTest, OverTheTrainersCommunicatorWhichItKeeps) {
  ncclComm_t comms[kRanks];
  const int devices[kRanks] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, kRanks, devices), ncclSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
      {
        auto transport = NcclTransport::Create(comms[rank], stream);
        ASSERT_TRUE(transport.ok()) << transport.status();
        EXPECT_EQ((*transport)->rank(), rank);
        EXPECT_EQ((*transport)->device(), rank);
        auto all = (*transport)->AllGatherBytes(std::string(rank + 1, 'k'));
        ASSERT_TRUE(all.ok()) << all.status();
        EXPECT_THAT(*all, ElementsAre("k", "kk"));
      }
      EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    });
  }
  for (std::thread& thread : threads) thread.join();
  // Still the trainer's: destroying them here is the first destroy.
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

TEST_F(NcclTransportDeviceTest, CreateRefusesAStreamOnAnotherDevice) {
  ncclComm_t comms[kRanks];
  const int devices[kRanks] = {0, 1};
  ASSERT_EQ(ncclCommInitAll(comms, kRanks, devices), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  cudaStream_t on_device_1;
  ASSERT_EQ(cudaStreamCreate(&on_device_1), cudaSuccess);
  auto transport = NcclTransport::Create(comms[0], on_device_1);
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument);
#if CUDART_VERSION >= 12080
  EXPECT_EQ(transport.status().message(),
            "stream: on CUDA device 1, but the communicator's rank is on device 0");
#else  // no cudaStreamGetDevice: the stream's device is not named
  EXPECT_EQ(transport.status().message(),
            "stream: not on CUDA device 0, the communicator's rank's device");
#endif
  EXPECT_EQ(cudaStreamDestroy(on_device_1), cudaSuccess);
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// These need no device: they fail before any CUDA or NCCL call.
TEST(NcclTransport, CreateRefusesANullCommunicator) {
  auto transport = NcclTransport::Create(nullptr, nullptr);
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(transport.status().message(), "comm: must not be null");
}

TEST(NcclTransport, CreateFromUniqueIdRefusesBadShapes) {
  const ncclUniqueId id{};
  EXPECT_EQ(NcclTransport::CreateFromUniqueId(id, 0, 0, 0, nullptr).status().message(),
            "size: 0; must be >= 1");
  EXPECT_EQ(NcclTransport::CreateFromUniqueId(id, 2, 2, 0, nullptr).status().message(),
            "rank: 2 is outside [0, 1]");
  EXPECT_EQ(NcclTransport::CreateFromUniqueId(id, -1, 2, 0, nullptr).status().message(),
            "rank: -1 is outside [0, 1]");
  EXPECT_EQ(NcclTransport::CreateFromUniqueId(id, 0, 2, -1, nullptr).status().message(),
            "device: -1; must be >= 0");
}

// One GPU: NCCL runs one rank per device, so the paths that need no peer
// (world size 1) are what a single-GPU machine can check.
class NcclOneDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  std::unique_ptr<NcclTransport> Join(NcclTransportOptions options = {}) {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    auto transport = NcclTransport::CreateFromUniqueId(id, 0, 1, 0, stream_, std::move(options));
    EXPECT_TRUE(transport.ok()) << transport.status();
    return transport.ok() ? *std::move(transport) : nullptr;
  }

  cudaStream_t side_ = nullptr;    // the trainer's (non-blocking) current stream
  cudaStream_t stream_ = nullptr;  // the transport's
};

void SleepOnStream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(milliseconds)));
}
void SetFlag(void* flag) { static_cast<std::atomic<bool>*>(flag)->store(true); }

// `send` is filled on the caller's non-blocking stream behind 300 ms of
// other work: the exchange must wait for it (event, not host sync), and the
// caller's stream must wait for the exchange before reading `recv`.
TEST_F(NcclOneDeviceTest, ASideStreamFillIsOrderedBeforeTheExchange) {
  NcclTransportOptions options;
  cudaStream_t side = side_;
  options.caller_stream = [side] { return side; };
  std::unique_ptr<NcclTransport> transport = Join(std::move(options));
  ASSERT_NE(transport, nullptr);
  constexpr int kBytes = 1 << 20;
  std::vector<uint8_t> zeros(kBytes, 0);
  DeviceBytes send(zeros), recv(zeros);
  uint8_t* pattern = nullptr;
  ASSERT_EQ(cudaMallocHost(&pattern, kBytes), cudaSuccess);
  for (int i = 0; i < kBytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  int sleep_ms = 300;
  std::atomic<bool> slept{false};
  ASSERT_EQ(cudaLaunchHostFunc(side_, SleepOnStream, &sleep_ms), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(side_, SetFlag, &slept), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(send.data(), pattern, kBytes, cudaMemcpyHostToDevice, side_),
            cudaSuccess);
  ASSERT_TRUE(
      transport
          ->AllToAll(send.data(), {kBytes}, recv.data(), {kBytes}, 1, AllToAllOptions::Checked())
          .ok());
  // The data path returned without waiting for the GPU.
  EXPECT_FALSE(slept.load()) << "the all-to-all waited for the caller's stream on the host";
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), recv.data(), kBytes, cudaMemcpyDeviceToHost, side_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(side_), cudaSuccess);
  EXPECT_TRUE(std::equal(back.begin(), back.end(), pattern)) << "recv holds stale bytes";
  cudaFreeHost(pattern);
}

TEST_F(NcclOneDeviceTest, CountCheckAndAllGatherOnOneRank) {
  std::unique_ptr<NcclTransport> transport = Join();
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(transport->cuda_device(), 0);
  EXPECT_TRUE(transport->CheckRowCounts({5}, {5}).ok());
  EXPECT_EQ(transport->CheckRowCounts({5}, {4}).message(),
            "recv_rows: rank 0 expects 4 rows from rank 0, which sends it 5");
  auto all = transport->AllGatherBytes("solo");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre("solo"));
}

TEST_F(NcclOneDeviceTest, SubgroupsAreRefusedWhileNcclCommIdIsSet) {
  std::unique_ptr<NcclTransport> transport = Join();
  ASSERT_NE(transport, nullptr);
  setenv("NCCL_COMM_ID", "127.0.0.1:29999", 1);
  auto sub = transport->Subgroup({0});
  unsetenv("NCCL_COMM_ID");
  EXPECT_EQ(sub.status().code(), absl::StatusCode::kFailedPrecondition) << sub.status();
  EXPECT_THAT(std::string(sub.status().message()), HasSubstr("NCCL_COMM_ID"));
  EXPECT_TRUE(transport->Subgroup({0}).ok());
}

// NCCL refuses two ranks of one communicator on one device: both ranks get
// an error (within the timeout), neither hangs.
TEST_F(NcclOneDeviceTest, TwoRanksOnOneDeviceAreRefused) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  absl::Status results[2];
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      cudaSetDevice(0);
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      NcclTransportOptions options;
      options.timeout = absl::Seconds(60);
      results[rank] =
          NcclTransport::CreateFromUniqueId(id, rank, 2, 0, stream, options).status();
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_FALSE(results[0].ok() && results[1].ok())
      << "NCCL accepted two ranks on one GPU; docs/client.md (GPUs) says it refuses them";
}

// Where CUDA cannot run (no device or no driver), joining is a status naming
// the CUDA call, not a crash.
TEST(NcclTransport, WithoutADeviceCreateIsAStatusNamingTheCall) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << "this machine has a CUDA device; the device tests cover it";
  }
  const ncclUniqueId id{};
  auto transport = NcclTransport::CreateFromUniqueId(id, 0, 1, 0, nullptr);
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().code(), absl::StatusCode::kFailedPrecondition) << transport.status();
  EXPECT_THAT(std::string(transport.status().message()), HasSubstr("cuda"));
}

}  // namespace
}  // namespace knapformer

#else  // !KNAPFORMER_HAVE_NCCL

TEST(NcclTransport, NeedsConfigCuda) {
  GTEST_SKIP() << "built without --config=cuda: the NCCL transport and its tests need a "
                  "CUDA toolkit with NCCL (third_party/cuda_configure.bzl) and "
                  "`bazel test --config=cuda`";
}

#endif  // KNAPFORMER_HAVE_NCCL
