#include "transport/nccl_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transport/agreement.h"
#include "transport/backend_checks.h"
#include "transport/exchange_plan.h"

namespace knapformer {
namespace {


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

// Called with `device` current (ScopedDevice).
absl::Status CheckStreamDevice(cudaStream_t stream, int device) {
#if CUDART_VERSION >= 12080
  int stream_device = -1;
  KF_RETURN_IF_ERROR(
      CudaStatus(cudaStreamGetDevice(stream, &stream_device), "cudaStreamGetDevice"));
  if (stream_device != device) {
    return absl::InvalidArgumentError(absl::StrCat("stream: on CUDA device ", stream_device,
                                                   ", but the communicator's rank is on device ",
                                                   device));
  }
  return absl::OkStatus();
#else
  // Before CUDA 12.8 the runtime cannot name a stream's device; recording an
  // event made on `device` into the stream fails when they differ.
  cudaEvent_t probe = nullptr;
  KF_RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&probe, cudaEventDisableTiming), "cudaEventCreate (stream check)"));
  const cudaError_t recorded = cudaEventRecord(probe, stream);
  cudaEventDestroy(probe);
  if (recorded == cudaErrorInvalidResourceHandle) {
    cudaGetLastError();  // not sticky: clear it
    return absl::InvalidArgumentError(absl::StrCat(
        "stream: not on CUDA device ", device, ", the communicator's rank's device"));
  }
  return CudaStatus(recorded, "cudaEventRecord (stream check)");
#endif
}

// Joins a communicator on the current device, non-blocking so that a
// member that never comes cannot hold the others past `timeout`. A failed
// init may still hand back a half-made communicator: abort it so it frees
// its resources.
absl::StatusOr<ncclComm_t> InitComm(const ncclUniqueId& id, int rank, int size,
                                    absl::Duration timeout, absl::string_view what) {
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const absl::Time deadline = absl::Now() + timeout;
  while (result == ncclInProgress && comm != nullptr) {
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::UnavailableError(absl::StrCat(
          "ncclCommInitRank (", what, "): not every member joined within the timeout"));
    }
    absl::SleepFor(absl::Microseconds(100));
    if (ncclCommGetAsyncError(comm, &result) != ncclSuccess) break;
  }
  if (result == ncclSuccess) return comm;
  absl::Status status = NcclStatus(result, "ncclCommInitRank", what, comm);
  if (comm != nullptr) ncclCommAbort(comm);
  return status;
}

absl::StatusOr<bool> EventDone(cudaEvent_t event, absl::string_view what) {
  const cudaError_t state = cudaEventQuery(event);
  if (state == cudaSuccess) return true;
  if (state == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: do not leave it for the trainer
    return false;
  }
  return CudaStatus(state, absl::StrCat("cudaEventQuery (", what, ")"));
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
      options_(options),
      events_(
          []() -> absl::StatusOr<cudaEvent_t> {
            cudaEvent_t event = nullptr;
            KF_RETURN_IF_ERROR(CudaStatus(
                cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"));
            return event;
          },
          [](cudaEvent_t event) { cudaEventDestroy(event); }) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(ncclComm_t comm,
                                                                     cudaStream_t stream,
                                                                     NcclTransportOptions options) {
  if (comm == nullptr) return absl::InvalidArgumentError("comm: must not be null");
  if (!(options.timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("timeout: must be > 0");
  }
  int rank = -1, size = -1, device = -1;
  KF_RETURN_IF_ERROR(
      NcclStatus(ncclCommUserRank(comm, &rank), "ncclCommUserRank", "create", comm));
  KF_RETURN_IF_ERROR(
      NcclStatus(ncclCommCount(comm, &size), "ncclCommCount", "create", comm));
  KF_RETURN_IF_ERROR(
      NcclStatus(ncclCommCuDevice(comm, &device), "ncclCommCuDevice", "create", comm));
  ScopedDevice on_device(device);
  KF_RETURN_IF_ERROR(on_device.status());
  KF_RETURN_IF_ERROR(CheckStreamDevice(stream, device));
  std::unique_ptr<NcclTransport> transport(
      new NcclTransport(comm, /*owned=*/false, stream, rank, size, device, std::move(options)));
  KF_RETURN_IF_ERROR(transport->Start());
  return transport;
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
  KF_RETURN_IF_ERROR(on_device.status());
  KF_RETURN_IF_ERROR(CheckStreamDevice(stream, device));
  if (!(options.timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("timeout: must be > 0");
  }
  absl::StatusOr<ncclComm_t> comm = InitComm(id, rank, size, options.timeout, "create");
  if (!comm.ok()) return comm.status();
  std::unique_ptr<NcclTransport> transport(
      new NcclTransport(*comm, /*owned=*/true, stream, rank, size, device, std::move(options)));
  KF_RETURN_IF_ERROR(transport->Start());
  return transport;
}

absl::Status NcclTransport::Start() {
  ScopedDevice on_device(device_);
  KF_RETURN_IF_ERROR(on_device.status());
  KF_RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming), "cudaEventCreate"));
  DeadlineWatchdog::Hooks hooks;
  const int device = device_;
  hooks.thread_init = [device] {
    cudaSetDevice(device);
    // Relaxed: the watchdog's event queries are neither refused by nor
    // break a CUDA graph the trainer captures meanwhile in the default
    // (global) capture mode, which would otherwise read as a CUDA error
    // here and abort the communicator.
    cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&relaxed);
  };
  hooks.poll_error = [this]() -> absl::Status {
    ncclResult_t async = ncclSuccess;
    KF_RETURN_IF_ERROR(
        NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", "watchdog",
                   comm_));
    return NcclStatus(async, "asynchronous NCCL error", "watchdog", comm_);
  };
  hooks.on_failure = [this](const absl::Status&) { Abort(); };
  watchdog_ = std::make_unique<DeadlineWatchdog>(std::move(hooks), absl::Milliseconds(1));
  return absl::OkStatus();
}

NcclTransport::~NcclTransport() {
  // First: the watchdog may abort the communicator while it runs.
  watchdog_.reset();
  ScopedDevice on_device(device_);
  // ncclCommDestroy may wait for peers, which after a failure may be gone:
  // an aborted communicator is not destroyed again.
  if (owned_ && !aborted_.load()) ncclCommDestroy(comm_);
  // Stream-ordered, so freeing never waits for the whole device.
  if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (caller_ready_ != nullptr) cudaEventDestroy(caller_ready_);
  events_.Clear();  // the watchdog, gone, has given every event back
}

void NcclTransport::Abort() {
  if (aborted_.exchange(true)) return;
  ScopedDevice on_device(device_);
  ncclCommAbort(comm_);
}

absl::Status NcclTransport::Usable() const {
  absl::Status failure = watchdog_->failure();
  if (failure.ok()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("NCCL transport unusable after an earlier failure: ", failure.message()));
}

void NcclTransport::NoteFailure(const absl::Status& status) {
  if (!status.ok() && !absl::IsInvalidArgument(status)) watchdog_->Fail(status);
}

cudaStream_t NcclTransport::CallerStream() const {
  return options_.caller_stream ? options_.caller_stream() : cudaStreamLegacy;
}

template <typename Ops>
absl::Status NcclTransport::Group(const char* what, Ops&& ops) {
  // Whatever the caller enqueued before this call (the kernel filling the
  // send buffer, its allocations) runs first.
  const cudaStream_t caller = CallerStream();
  if (caller != stream_) {
    KF_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(caller_ready_, caller), "cudaEventRecord (caller stream)"));
    KF_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, caller_ready_, 0),
                                          "cudaStreamWaitEvent (transport stream)"));
  }
  KF_RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "ncclGroupStart", what, comm_));
  // Close the group even when enqueueing failed: NCCL's group state is per
  // thread and would swallow the caller's next operations.
  const absl::Status enqueued = ops();
  ncclResult_t ended = ncclGroupEnd();
  // A non-blocking communicator finishes the launch in the background.
  const absl::Time deadline = absl::Now() + options_.timeout;
  while (ended == ncclInProgress) {
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("ncclGroupEnd (", what, "): the launch did not finish within the timeout"));
    }
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &ended) != ncclSuccess) break;
  }
  KF_RETURN_IF_ERROR(enqueued);
  return NcclStatus(ended, "ncclGroupEnd", what, comm_);
}

absl::Status NcclTransport::Publish(const char* what) {
  KF_ASSIGN_OR_RETURN(cudaEvent_t done, events_.Take());
  absl::Status status = CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
  const cudaStream_t caller = CallerStream();
  if (status.ok() && caller != stream_) {
    status = CudaStatus(cudaStreamWaitEvent(caller, done, 0), "cudaStreamWaitEvent (caller)");
  }
  if (!status.ok()) {
    events_.Give(done);
    return status;
  }
  const std::string name = what;
  // Given back once done (or once the watchdog goes): reused by a later
  // exchange, not made and destroyed per exchange.
  watchdog_->Watch([done, name] { return EventDone(done, name); },
                   [this, done] { events_.Give(done); }, absl::Now() + options_.timeout, name);
  return absl::OkStatus();
}

absl::Status NcclTransport::WaitHost(const char* what) {
  KF_ASSIGN_OR_RETURN(cudaEvent_t done, events_.Take());
  absl::Status status = CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
  if (status.ok()) {
    const std::string name = what;
    status = watchdog_->Wait([done, name] { return EventDone(done, name); },
                             absl::Now() + options_.timeout, name);
  }
  // After a failure the communicator is aborted and the event completes.
  events_.Give(done);
  return status;
}

absl::StatusOr<char*> NcclTransport::Staging(size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  const size_t grown = std::max(bytes, 2 * staging_bytes_);
  if (staging_ != nullptr) {
    cudaFreeHost(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  void* buffer = nullptr;
  KF_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&buffer, grown),
                                        absl::StrCat("cudaMallocHost(", grown, " bytes)")));
  staging_ = static_cast<char*>(buffer);
  staging_bytes_ = grown;
  return staging_;
}

absl::StatusOr<char*> NcclTransport::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Doubling keeps the (stream-ordered, so cheap) reallocations rare.
  const size_t grown = std::max(bytes, 2 * scratch_bytes_);
  if (scratch_ != nullptr) {
    KF_RETURN_IF_ERROR(CudaStatus(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync"));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  void* buffer = nullptr;
  KF_RETURN_IF_ERROR(CudaStatus(cudaMallocAsync(&buffer, grown, stream_),
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
  absl::StatusOr<char*> staging = Staging(bytes * size_);
  if (!staging.ok()) return staging.status();
  std::memcpy(*staging, mine.data(), bytes);
  char* slot = *scratch + bytes * rank_;
  KF_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(slot, *staging, bytes, cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (int64 all-gather, to device)"));
  // In place (this rank's slot of the output is the input), so one buffer
  // serves both sides.
  KF_RETURN_IF_ERROR(Group("int64 all-gather", [&] {
    return NcclStatus(ncclAllGather(slot, *scratch, count, ncclInt64, comm_, stream_),
                      "ncclAllGather", "int64 all-gather", comm_);
  }));
  KF_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(*staging, *scratch, bytes * size_, cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (int64 all-gather, to host)"));
  KF_RETURN_IF_ERROR(WaitHost("int64 all-gather"));
  std::vector<int64_t> all(count * size_);
  std::memcpy(all.data(), *staging, bytes * size_);
  return all;
}

absl::StatusOr<std::vector<int64_t>> NcclTransport::ExchangeCounts(
    const std::vector<int64_t>& send_rows) {
  const int n = size_;
  const size_t bytes = n * sizeof(int64_t);
  absl::StatusOr<char*> scratch = Scratch(2 * bytes);
  if (!scratch.ok()) return scratch.status();
  absl::StatusOr<char*> staging = Staging(bytes);
  if (!staging.ok()) return staging.status();
  int64_t* mine = reinterpret_cast<int64_t*>(*scratch);
  int64_t* theirs = mine + n;
  std::memcpy(*staging, send_rows.data(), bytes);
  KF_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(mine, *staging, bytes, cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (row counts, to device)"));
  // An all-to-all of one int64 per peer: ncclAlltoAll would do, but send/recv
  // pairs work on every NCCL 2.x the trainer may bring.
  KF_RETURN_IF_ERROR(Group("row count exchange", [&]() -> absl::Status {
    for (int p = 0; p < n; ++p) {
      KF_RETURN_IF_ERROR(NcclStatus(ncclSend(mine + p, 1, ncclInt64, p, comm_, stream_),
                                            "ncclSend", "row count exchange", comm_));
      KF_RETURN_IF_ERROR(NcclStatus(ncclRecv(theirs + p, 1, ncclInt64, p, comm_, stream_),
                                            "ncclRecv", "row count exchange", comm_));
    }
    return absl::OkStatus();
  }));
  KF_RETURN_IF_ERROR(
      CudaStatus(cudaMemcpyAsync(*staging, theirs, bytes, cudaMemcpyDeviceToHost, stream_),
                 "cudaMemcpyAsync (row counts, to host)"));
  KF_RETURN_IF_ERROR(WaitHost("row count exchange"));
  std::vector<int64_t> sent_to_me(n);
  std::memcpy(sent_to_me.data(), *staging, bytes);
  return sent_to_me;
}

absl::Status NcclTransport::CheckCounts(const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                                        bool refuse) {
  absl::StatusOr<std::vector<int64_t>> sent_to_me =
      ExchangeCounts(refuse ? std::vector<int64_t>(size_, 0) : send_rows);
  if (!sent_to_me.ok()) return sent_to_me.status();
  // Every rank learns every rank's verdict, so that all of them return the
  // same error, not only the one that saw it.
  absl::StatusOr<std::vector<int64_t>> verdicts =
      AllGatherInt64(refuse ? RefusingVerdict(rank_, size_)
                            : CountVerdict(rank_, size_, *sent_to_me, recv_rows, row_bytes));
  if (!verdicts.ok()) return verdicts.status();
  return JudgeVerdicts(*verdicts, size_);
}

absl::Status NcclTransport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  KF_RETURN_IF_ERROR(Usable());
  // A rank with malformed vectors still takes part, refusing.
  const absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, size_);
  ScopedDevice on_device(device_);
  KF_RETURN_IF_ERROR(on_device.status());
  // Row size 0 on every rank: the verdicts compare counts only.
  absl::Status status = CheckCounts(send_rows, recv_rows, /*row_bytes=*/0, !sizes.ok());
  NoteFailure(status);
  return sizes.ok() ? status : sizes;
}

absl::Status NcclTransport::MoveRows(const void* send, const std::vector<int64_t>& send_rows,
                                     void* recv, const std::vector<int64_t>& recv_rows,
                                     int64_t row_bytes, bool counts_checked) {
  const bool check_counts = options_.check_counts && !counts_checked;
  KF_RETURN_IF_ERROR(Usable());
  absl::Status valid = CheckExchange(send_rows, recv_rows, row_bytes, size_);
  if (valid.ok()) valid = CheckBuffers(send, send_rows, recv, recv_rows, row_bytes);
  ScopedDevice on_device(device_);
  KF_RETURN_IF_ERROR(on_device.status());
  if (check_counts) {
    // Every rank takes part in the check, whatever its own arguments, so a
    // local mistake fails every rank instead of leaving them waiting.
    absl::Status checked = CheckCounts(send_rows, recv_rows, row_bytes, !valid.ok());
    NoteFailure(checked);
    if (!valid.ok()) return valid;
    if (!checked.ok()) return checked;
  } else if (!valid.ok()) {
    return valid;
  }
  absl::Status status = DoAllToAllRows(send, send_rows, recv, recv_rows, row_bytes);
  NoteFailure(status);
  return status;
}

absl::Status NcclTransport::DoAllToAllRows(const void* send, const std::vector<int64_t>& send_rows,
                                           void* recv, const std::vector<int64_t>& recv_rows,
                                           int64_t row_bytes) {
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const std::vector<PeerTransfer> transfers = PeerTransfers(send_rows, recv_rows, row_bytes);
  KF_RETURN_IF_ERROR(Group("all-to-all", [&]() -> absl::Status {
    for (const PeerTransfer& t : transfers) {
      // The counts agree (checked), so both sides skip the same pairs: no
      // empty operation is queued and a null buffer is never passed.
      if (t.send_bytes > 0) {
        KF_RETURN_IF_ERROR(
            NcclStatus(ncclSend(in + t.send_offset, static_cast<size_t>(t.send_bytes), ncclUint8,
                                t.peer, comm_, stream_),
                       "ncclSend", "all-to-all", comm_));
      }
      if (t.recv_bytes > 0) {
        KF_RETURN_IF_ERROR(
            NcclStatus(ncclRecv(out + t.recv_offset, static_cast<size_t>(t.recv_bytes), ncclUint8,
                                t.peer, comm_, stream_),
                       "ncclRecv", "all-to-all", comm_));
      }
    }
    return absl::OkStatus();
  }));
  // No host wait: the caller's stream waits for the exchange, the watchdog
  // for its deadline.
  return Publish("all-to-all");
}

absl::StatusOr<std::vector<std::string>> NcclTransport::AllGatherBytes(absl::string_view mine) {
  KF_RETURN_IF_ERROR(Usable());
  ScopedDevice on_device(device_);
  KF_RETURN_IF_ERROR(on_device.status());
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
  absl::StatusOr<char*> staging = Staging(longest * size_);
  if (!staging.ok()) return staging.status();
  char* slot = *scratch + longest * rank_;
  if (!mine.empty()) {
    std::memcpy(*staging, mine.data(), mine.size());
    KF_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(slot, *staging, mine.size(), cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync (byte all-gather, to device)"));
  }
  KF_RETURN_IF_ERROR(Group("byte all-gather", [&] {
    return NcclStatus(ncclAllGather(slot, *scratch, longest, ncclUint8, comm_, stream_),
                      "ncclAllGather", "byte all-gather", comm_);
  }));
  KF_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(*staging, *scratch, longest * size_, cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync (byte all-gather, to host)"));
  KF_RETURN_IF_ERROR(WaitHost("byte all-gather"));
  for (int p = 0; p < size_; ++p) result[p].assign(*staging + longest * p, (*lengths)[p]);
  return result;
}

absl::StatusOr<std::unique_ptr<Transport>> NcclTransport::Subgroup(const std::vector<int>& ranks) {
  KF_RETURN_IF_ERROR(Usable());
  absl::StatusOr<int> my_index = IndexInSubgroup(ranks, rank_, size_);
  if (!my_index.ok()) return my_index.status();
  ScopedDevice on_device(device_);
  KF_RETURN_IF_ERROR(on_device.status());
  absl::StatusOr<std::unique_ptr<Transport>> sub = DoSubgroup(ranks, *my_index);
  NoteFailure(sub.status());
  return sub;
}

absl::StatusOr<ncclUniqueId> NcclTransport::ShareUniqueId(const std::vector<int>& ranks,
                                                          int my_index) {
  ncclUniqueId id{};
  const bool leader = my_index == 0;
  if (const char* fixed = std::getenv("NCCL_COMM_ID"); fixed != nullptr && *fixed != '\0') {
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL_COMM_ID=", fixed, " is set: every ncclGetUniqueId then names that one address and "
        "bags created together would join each other; unset it for the bag communicators"));
  }
  if (leader) {
    KF_RETURN_IF_ERROR(
        NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", "subgroup", comm_));
  }
  if (ranks.size() == 1) return id;
  absl::StatusOr<char*> scratch = Scratch(sizeof(id));
  if (!scratch.ok()) return scratch.status();
  absl::StatusOr<char*> staging = Staging(sizeof(id));
  if (!staging.ok()) return staging.status();
  if (leader) {
    std::memcpy(*staging, &id, sizeof(id));
    KF_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(*scratch, *staging, sizeof(id), cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync (subgroup id, to device)"));
  }
  // Point-to-point on the parent: only the members take part.
  KF_RETURN_IF_ERROR(Group("subgroup id", [&]() -> absl::Status {
    if (!leader) {
      return NcclStatus(ncclRecv(*scratch, sizeof(id), ncclUint8, ranks[0], comm_, stream_),
                        "ncclRecv", "subgroup id", comm_);
    }
    for (size_t i = 1; i < ranks.size(); ++i) {
      KF_RETURN_IF_ERROR(
          NcclStatus(ncclSend(*scratch, sizeof(id), ncclUint8, ranks[i], comm_, stream_),
                     "ncclSend", "subgroup id", comm_));
    }
    return absl::OkStatus();
  }));
  if (!leader) {
    KF_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(*staging, *scratch, sizeof(id), cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync (subgroup id, to host)"));
  }
  KF_RETURN_IF_ERROR(WaitHost("subgroup id"));
  if (!leader) std::memcpy(&id, *staging, sizeof(id));
  return id;
}

absl::StatusOr<std::unique_ptr<Transport>> NcclTransport::DoSubgroup(const std::vector<int>& ranks,
                                                                     int my_index) {
  absl::StatusOr<ncclUniqueId> id = ShareUniqueId(ranks, my_index);
  if (!id.ok()) return id.status();
  const int size = static_cast<int>(ranks.size());
  absl::StatusOr<ncclComm_t> comm = InitComm(*id, my_index, size, options_.timeout, "subgroup");
  if (!comm.ok()) return comm.status();
  std::unique_ptr<NcclTransport> sub(
      new NcclTransport(*comm, /*owned=*/true, stream_, my_index, size, device_, options_));
  KF_RETURN_IF_ERROR(sub->Start());
  return std::unique_ptr<Transport>(std::move(sub));
}

}  // namespace knapformer

