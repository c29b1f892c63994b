#include "transport/nccl_transport.h"

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

// absl 20220623 has no status macros. Local to this file, undefined at its end.
#define KNAPFORMER_RETURN_IF_ERROR(expr)                   \
  do {                                                     \
    absl::Status knapformer_status = (expr);               \
    if (!knapformer_status.ok()) return knapformer_status; \
  } while (false)

namespace knapformer {
namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

absl::Status CudaStatus(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Reported here: clear it so that the trainer's next cudaGetLastError
  // does not blame its own work for it (sticky errors stay regardless).
  cudaGetLastError();
  const std::string message =
      absl::StrCat(call, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view call, absl::string_view what,
                        ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(call, " (", what, "): ", ncclGetErrorString(result));
  // The error string alone is generic ("unhandled system error"); the last
  // error says which peer or socket.
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') absl::StrAppend(&message, ": ", detail);
  if (result == ncclSystemError || result == ncclRemoteError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

// CUDA calls act on the calling thread's current device, and the trainer's
// thread may have another one current (or none yet). Restores it on exit.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    int previous = -1;
    status_ = CudaStatus(cudaGetDevice(&previous), "cudaGetDevice");
    if (status_.ok() && previous != device) {
      status_ = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
      if (status_.ok()) previous_ = previous;
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  int previous_ = -1;  // to restore, or -1
};

// The bytes of `rows` rows of `row_bytes` bytes, refusing negative counts
// and totals beyond int64 (which NCCL's size_t counts would wrap).
absl::StatusOr<int64_t> TotalBytes(const std::vector<int64_t>& rows, int64_t row_bytes,
                                   absl::string_view field) {
  int64_t total_rows = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    if (rows[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", p, "]: ", rows[p], " rows; must be >= 0"));
    }
    if (rows[p] > kMaxInt64 - total_rows) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": the total exceeds ", kMaxInt64));
    }
    total_rows += rows[p];
  }
  if (row_bytes > 0 && total_rows > kMaxInt64 / row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", total_rows, " rows of ", row_bytes,
                                                   " bytes exceed ", kMaxInt64, " bytes"));
  }
  return total_rows * row_bytes;
}

absl::Status CheckBuffer(const void* buffer, int64_t bytes, absl::string_view field) {
  if (buffer == nullptr && bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": null, but ", bytes, " bytes are to move through it"));
  }
  return absl::OkStatus();
}

// What a rank reports to the others after the count exchange: its first
// disagreeing (receiver, sender) pair as receiver * size + sender (kNoMismatch
// when none), the rows it expected and got there, and its row size.
constexpr int kVerdictFields = 4;
constexpr int64_t kNoMismatch = kMaxInt64;

std::vector<int64_t> Verdict(int rank, int size, const std::vector<int64_t>& sent_to_me,
                             const std::vector<int64_t>& recv_rows, int64_t row_bytes) {
  for (int p = 0; p < size; ++p) {
    if (sent_to_me[p] != recv_rows[p]) {
      return {int64_t{rank} * size + p, recv_rows[p], sent_to_me[p], row_bytes};
    }
  }
  return {kNoMismatch, 0, 0, row_bytes};
}

// The same error on every rank, from every rank's verdict: the first
// differing row size, else the disagreement with the smallest receiver,
// then sender.
absl::Status JudgeVerdicts(const std::vector<int64_t>& verdicts, int size) {
  auto field = [&](int rank, int index) { return verdicts[rank * kVerdictFields + index]; };
  for (int p = 1; p < size; ++p) {
    if (field(p, 3) != field(0, 3)) {
      return absl::InvalidArgumentError(absl::StrCat("row_bytes: rank 0 moves rows of ",
                                                     field(0, 3), " bytes, rank ", p, " of ",
                                                     field(p, 3)));
    }
  }
  int first = 0;
  for (int p = 1; p < size; ++p) {
    if (field(p, 0) < field(first, 0)) first = p;
  }
  const int64_t pair = field(first, 0);
  if (pair == kNoMismatch) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("recv_rows: rank ", pair / size, " expects ",
                                                 field(first, 1), " rows from rank ", pair % size,
                                                 ", which sends it ", field(first, 2)));
}

absl::Status CheckSubgroupRanks(const std::vector<int>& ranks, int rank, int size, int* my_index) {
  *my_index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: [", absl::StrJoin(ranks, ","), "] must be ascending ranks of a group of ", size));
    }
    if (ranks[i] == rank) *my_index = static_cast<int>(i);
  }
  if (*my_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks: [", absl::StrJoin(ranks, ","), "] does not contain rank ", rank));
  }
  return absl::OkStatus();
}

absl::Status CheckStreamDevice(cudaStream_t stream, int device) {
  int stream_device = -1;
  KNAPFORMER_RETURN_IF_ERROR(
      CudaStatus(cudaStreamGetDevice(stream, &stream_device), "cudaStreamGetDevice"));
  if (stream_device != device) {
    return absl::InvalidArgumentError(absl::StrCat("stream: on CUDA device ", stream_device,
                                                   ", but the communicator's rank is on device ",
                                                   device));
  }
  return absl::OkStatus();
}

// Joins a communicator on the current device. A failed blocking init may
// still hand back a half-made communicator: abort it so it frees its
// resources.
absl::StatusOr<ncclComm_t> InitComm(const ncclUniqueId& id, int rank, int size,
                                    absl::string_view what) {
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRank(&comm, size, id, rank);
  if (result == ncclSuccess) return comm;
  absl::Status status = NcclStatus(result, "ncclCommInitRank", what, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  return status;
}

}  // namespace

NcclTransport::NcclTransport(ncclComm_t comm, bool owned, cudaStream_t stream, int rank, int size,
                             int device, NcclTransportOptions options)
    : comm_(comm),
      owned_(owned),
      stream_(stream),
      rank_(rank),
      size_(size),
      device_(device),
      options_(options) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(ncclComm_t comm,
                                                                     cudaStream_t stream,
                                                                     NcclTransportOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("comm: must not be null");
  int rank = -1, size = -1, device = -1;
  KNAPFORMER_RETURN_IF_ERROR(
      NcclStatus(ncclCommUserRank(comm, &rank), "ncclCommUserRank", "create", comm));
  KNAPFORMER_RETURN_IF_ERROR(
      NcclStatus(ncclCommCount(comm, &size), "ncclCommCount", "create", comm));
  KNAPFORMER_RETURN_IF_ERROR(
      NcclStatus(ncclCommCuDevice(comm, &device), "ncclCommCuDevice", "create", comm));
  ScopedDevice on_device(device);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  KNAPFORMER_RETURN_IF_ERROR(CheckStreamDevice(stream, device));
  return std::unique_ptr<NcclTransport>(
      new NcclTransport(comm, /*owned=*/false, stream, rank, size, device, options));
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::CreateFromUniqueId(
    const ncclUniqueId& id, int rank, int size, int device, cudaStream_t stream,
    NcclTransportOptions options) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("size: ", size, "; must be >= 1"));
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is outside [0, ", size - 1, "]"));
  }
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device: ", device, "; must be >= 0"));
  }
  // ncclCommInitRank takes its device from the current one.
  ScopedDevice on_device(device);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  KNAPFORMER_RETURN_IF_ERROR(CheckStreamDevice(stream, device));
  absl::StatusOr<ncclComm_t> comm = InitComm(id, rank, size, "create");
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<NcclTransport>(
      new NcclTransport(*comm, /*owned=*/true, stream, rank, size, device, options));
}

NcclTransport::~NcclTransport() {
  ScopedDevice on_device(device_);
  if (owned_) {
    // ncclCommDestroy may wait for peers; after an error they may be gone.
    if (broken_.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  // Stream-ordered, so freeing never waits for the whole device.
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
}

absl::Status NcclTransport::Usable() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("NCCL transport unusable after an earlier error: ", broken_.message()));
}

void NcclTransport::NoteFailure(const absl::Status& status) {
  if (!status.ok() && !absl::IsInvalidArgument(status) && broken_.ok()) broken_ = status;
}

template <typename Ops>
absl::Status NcclTransport::Group(const char* what, Ops&& ops) {
  KNAPFORMER_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", what, comm_));
  // Close the group even when enqueueing failed: NCCL's group state is per
  // thread and would swallow the caller's next operations.
  const absl::Status enqueued = ops();
  ncclResult_t ended = ncclGroupEnd();
  // A non-blocking communicator finishes the launch in the background.
  while (ended == ncclInProgress) {
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &ended) != ncclSuccess) break;
  }
  KNAPFORMER_RETURN_IF_ERROR(enqueued);
  return NcclStatus(ended, "ncclGroupEnd", what, comm_);
}

absl::Status NcclTransport::Sync(const char* what) {
  KNAPFORMER_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_),
                                        absl::StrCat("cudaStreamSynchronize (", what, ")")));
  // A peer's failure may show here only, not as a CUDA error.
  ncclResult_t async = ncclSuccess;
  KNAPFORMER_RETURN_IF_ERROR(
      NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", what, comm_));
  return NcclStatus(async, "asynchronous NCCL error", what, comm_);
}

absl::StatusOr<char*> NcclTransport::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Doubling keeps the (stream-ordered, so cheap) reallocations rare.
  const size_t grown = std::max(bytes, 2 * scratch_bytes_);
  if (scratch_ != nullptr) {
    KNAPFORMER_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync"));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  void* buffer = nullptr;
  KNAPFORMER_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&buffer, grown, stream_),
                                        absl::StrCat("cudaMallocAsync(", grown, " bytes)")));
  scratch_ = static_cast<char*>(buffer);
  scratch_bytes_ = grown;
  return scratch_;
}

absl::StatusOr<std::vector<int64_t>> NcclTransport::AllGatherInt64(
    const std::vector<int64_t>& mine) {
  const size_t count = mine.size();
  const size_t bytes = count * sizeof(int64_t);
  absl::StatusOr<char*> scratch = Scratch(bytes * size_);
  if (!scratch.ok()) return scratch.status();
  char* slot = *scratch + bytes * rank_;
  KNAPFORMER_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(slot, mine.data(), bytes, cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (int64 all-gather, to device)"));
  // In place (this rank's slot of the output is the input), so one buffer
  // serves both sides.
  KNAPFORMER_RETURN_IF_ERROR(Group("int64 all-gather", [&] {
    return NcclStatus(ncclAllGather(slot, *scratch, count, ncclInt64, comm_, stream_),
                      "ncclAllGather", "int64 all-gather", comm_);
  }));
  std::vector<int64_t> all(count * size_);
  KNAPFORMER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(all.data(), *scratch, bytes * size_, cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (int64 all-gather, to host)"));
  KNAPFORMER_RETURN_IF_ERROR(Sync("int64 all-gather"));
  return all;
}

absl::StatusOr<std::vector<int64_t>> NcclTransport::ExchangeCounts(
    const std::vector<int64_t>& send_rows) {
  const int n = size_;
  absl::StatusOr<char*> scratch = Scratch(2 * n * sizeof(int64_t));
  if (!scratch.ok()) return scratch.status();
  int64_t* mine = reinterpret_cast<int64_t*>(*scratch);
  int64_t* theirs = mine + n;
  KNAPFORMER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(mine, send_rows.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync (row counts, to device)"));
  // An all-to-all of one int64 per peer: ncclAlltoAll would do, but send/recv
  // pairs work on every NCCL 2.x the trainer may bring.
  KNAPFORMER_RETURN_IF_ERROR(Group("row count exchange", [&]() -> absl::Status {
    for (int p = 0; p < n; ++p) {
      KNAPFORMER_RETURN_IF_ERROR(NcclStatus(ncclSend(mine + p, 1, ncclInt64, p, comm_, stream_),
                                            "ncclSend", "row count exchange", comm_));
      KNAPFORMER_RETURN_IF_ERROR(NcclStatus(ncclRecv(theirs + p, 1, ncclInt64, p, comm_, stream_),
                                            "ncclRecv", "row count exchange", comm_));
    }
    return absl::OkStatus();
  }));
  std::vector<int64_t> sent_to_me(n);
  KNAPFORMER_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(sent_to_me.data(), theirs, n * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync (row counts, to host)"));
  KNAPFORMER_RETURN_IF_ERROR(Sync("row count exchange"));
  return sent_to_me;
}

absl::Status NcclTransport::CheckCounts(const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& recv_rows, int64_t row_bytes) {
  absl::StatusOr<std::vector<int64_t>> sent_to_me = ExchangeCounts(send_rows);
  if (!sent_to_me.ok()) return sent_to_me.status();
  // Every rank learns every rank's verdict, so that all of them return the
  // same error, not only the one that saw it.
  absl::StatusOr<std::vector<int64_t>> verdicts =
      AllGatherInt64(Verdict(rank_, size_, *sent_to_me, recv_rows, row_bytes));
  if (!verdicts.ok()) return verdicts.status();
  return JudgeVerdicts(*verdicts, size_);
}

absl::Status NcclTransport::AllToAllRows(const void* send, const std::vector<int64_t>& send_rows,
                                         void* recv, const std::vector<int64_t>& recv_rows,
                                         int64_t row_bytes) {
  return AllToAll(send, send_rows, recv, recv_rows, row_bytes, options_.check_counts);
}

absl::Status NcclTransport::AllToAllRowsPrechecked(const void* send,
                                                   const std::vector<int64_t>& send_rows,
                                                   void* recv,
                                                   const std::vector<int64_t>& recv_rows,
                                                   int64_t row_bytes) {
  return AllToAll(send, send_rows, recv, recv_rows, row_bytes, /*check_counts=*/false);
}

absl::Status NcclTransport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  KNAPFORMER_RETURN_IF_ERROR(Usable());
  KNAPFORMER_RETURN_IF_ERROR(CheckRowVectorSizes(send_rows, recv_rows, size_));
  ScopedDevice on_device(device_);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  // Row size 0 on every rank: the verdicts compare counts only.
  absl::Status status = CheckCounts(send_rows, recv_rows, /*row_bytes=*/0);
  NoteFailure(status);
  return status;
}

absl::Status NcclTransport::AllToAll(const void* send, const std::vector<int64_t>& send_rows,
                                     void* recv, const std::vector<int64_t>& recv_rows,
                                     int64_t row_bytes, bool check_counts) {
  KNAPFORMER_RETURN_IF_ERROR(Usable());
  const int n = size_;
  KNAPFORMER_RETURN_IF_ERROR(CheckRowVectorSizes(send_rows, recv_rows, n));
  if (row_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_bytes: ", row_bytes, "; must be >= 0"));
  }
  absl::StatusOr<int64_t> send_bytes = TotalBytes(send_rows, row_bytes, "send_rows");
  if (!send_bytes.ok()) return send_bytes.status();
  absl::StatusOr<int64_t> recv_bytes = TotalBytes(recv_rows, row_bytes, "recv_rows");
  if (!recv_bytes.ok()) return recv_bytes.status();
  KNAPFORMER_RETURN_IF_ERROR(CheckBuffer(send, *send_bytes, "send"));
  KNAPFORMER_RETURN_IF_ERROR(CheckBuffer(recv, *recv_bytes, "recv"));
  ScopedDevice on_device(device_);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  absl::Status status = DoAllToAllRows(send, send_rows, recv, recv_rows, row_bytes, check_counts);
  NoteFailure(status);
  return status;
}

absl::Status NcclTransport::DoAllToAllRows(const void* send, const std::vector<int64_t>& send_rows,
                                           void* recv, const std::vector<int64_t>& recv_rows,
                                           int64_t row_bytes, bool check_counts) {
  if (check_counts) {
    KNAPFORMER_RETURN_IF_ERROR(CheckCounts(send_rows, recv_rows, row_bytes));
  }
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  KNAPFORMER_RETURN_IF_ERROR(Group("all-to-all", [&]() -> absl::Status {
    for (int p = 0; p < size_; ++p) {
      const size_t to_send = static_cast<size_t>(send_rows[p] * row_bytes);
      const size_t to_recv = static_cast<size_t>(recv_rows[p] * row_bytes);
      // The counts agree (checked above), so both sides skip the same pairs:
      // no empty operation is queued and a null buffer is never passed.
      if (to_send > 0) {
        KNAPFORMER_RETURN_IF_ERROR(NcclStatus(ncclSend(in, to_send, ncclUint8, p, comm_, stream_),
                                              "ncclSend", "all-to-all", comm_));
      }
      if (to_recv > 0) {
        KNAPFORMER_RETURN_IF_ERROR(NcclStatus(ncclRecv(out, to_recv, ncclUint8, p, comm_, stream_),
                                              "ncclRecv", "all-to-all", comm_));
      }
      in += to_send;
      out += to_recv;
    }
    return absl::OkStatus();
  }));
  return Sync("all-to-all");
}

absl::StatusOr<std::vector<std::string>> NcclTransport::AllGatherBytes(absl::string_view mine) {
  KNAPFORMER_RETURN_IF_ERROR(Usable());
  ScopedDevice on_device(device_);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  absl::StatusOr<std::vector<std::string>> all = DoAllGatherBytes(mine);
  NoteFailure(all.status());
  return all;
}

absl::StatusOr<std::vector<std::string>> NcclTransport::DoAllGatherBytes(absl::string_view mine) {
  absl::StatusOr<std::vector<int64_t>> lengths =
      AllGatherInt64({static_cast<int64_t>(mine.size())});
  if (!lengths.ok()) return lengths.status();
  const size_t longest = static_cast<size_t>(*std::max_element(lengths->begin(), lengths->end()));
  std::vector<std::string> result(size_);
  // Every rank sees the same lengths, so all of them skip together.
  if (longest == 0) return result;
  // ncclAllGather moves the same count from every rank: pad to the longest.
  absl::StatusOr<char*> scratch = Scratch(longest * size_);
  if (!scratch.ok()) return scratch.status();
  char* slot = *scratch + longest * rank_;
  if (!mine.empty()) {
    KNAPFORMER_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(slot, mine.data(), mine.size(), cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync (byte all-gather, to device)"));
  }
  KNAPFORMER_RETURN_IF_ERROR(Group("byte all-gather", [&] {
    return NcclStatus(ncclAllGather(slot, *scratch, longest, ncclUint8, comm_, stream_),
                      "ncclAllGather", "byte all-gather", comm_);
  }));
  std::string host(longest * size_, '\0');
  KNAPFORMER_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(host.data(), *scratch, host.size(), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (byte all-gather, to host)"));
  KNAPFORMER_RETURN_IF_ERROR(Sync("byte all-gather"));
  for (int p = 0; p < size_; ++p) result[p] = host.substr(longest * p, (*lengths)[p]);
  return result;
}

absl::StatusOr<std::unique_ptr<Transport>> NcclTransport::Subgroup(const std::vector<int>& ranks) {
  KNAPFORMER_RETURN_IF_ERROR(Usable());
  int my_index = -1;
  KNAPFORMER_RETURN_IF_ERROR(CheckSubgroupRanks(ranks, rank_, size_, &my_index));
  ScopedDevice on_device(device_);
  KNAPFORMER_RETURN_IF_ERROR(on_device.status());
  absl::StatusOr<std::unique_ptr<Transport>> sub = DoSubgroup(ranks, my_index);
  NoteFailure(sub.status());
  return sub;
}

absl::StatusOr<ncclUniqueId> NcclTransport::ShareUniqueId(const std::vector<int>& ranks,
                                                          int my_index) {
  ncclUniqueId id{};
  const bool leader = my_index == 0;
  if (leader) {
    KNAPFORMER_RETURN_IF_ERROR(
        NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", "subgroup", comm_));
  }
  if (ranks.size() == 1) return id;
  absl::StatusOr<char*> scratch = Scratch(sizeof(id));
  if (!scratch.ok()) return scratch.status();
  if (leader) {
    KNAPFORMER_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(*scratch, &id, sizeof(id), cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync (subgroup id, to device)"));
  }
  // Point-to-point on the parent: only the members take part.
  KNAPFORMER_RETURN_IF_ERROR(Group("subgroup id", [&]() -> absl::Status {
    if (!leader) {
      return NcclStatus(ncclRecv(*scratch, sizeof(id), ncclUint8, ranks[0], comm_, stream_),
                        "ncclRecv", "subgroup id", comm_);
    }
    for (size_t i = 1; i < ranks.size(); ++i) {
      KNAPFORMER_RETURN_IF_ERROR(
          NcclStatus(ncclSend(*scratch, sizeof(id), ncclUint8, ranks[i], comm_, stream_),
                     "ncclSend", "subgroup id", comm_));
    }
    return absl::OkStatus();
  }));
  if (!leader) {
    KNAPFORMER_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(&id, *scratch, sizeof(id), cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync (subgroup id, to host)"));
  }
  KNAPFORMER_RETURN_IF_ERROR(Sync("subgroup id"));
  return id;
}

absl::StatusOr<std::unique_ptr<Transport>> NcclTransport::DoSubgroup(const std::vector<int>& ranks,
                                                                     int my_index) {
  absl::StatusOr<ncclUniqueId> id = ShareUniqueId(ranks, my_index);
  if (!id.ok()) return id.status();
  const int size = static_cast<int>(ranks.size());
  absl::StatusOr<ncclComm_t> comm = InitComm(*id, my_index, size, "subgroup");
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Transport>(
      new NcclTransport(*comm, /*owned=*/true, stream_, my_index, size, device_, options_));
}

}  // namespace knapformer

#undef KNAPFORMER_RETURN_IF_ERROR
