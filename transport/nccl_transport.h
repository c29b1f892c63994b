#ifndef KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_

// The transport over raw NCCL (no LibTorch): for trainers that hold an
// ncclComm_t of their own. Built only under `--config=cuda`
// (//transport:nccl_transport is empty otherwise and defines
// KNAPFORMER_HAVE_NCCL when it is not).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/deadline_watchdog.h"
#include "transport/resource_pool.h"
#include "transport/transport.h"

namespace knapformer {

struct NcclTransportOptions {
  // Cross-check every all-to-all's row counts (and row sizes) against the
  // peers' first: one send/recv of 8 bytes per peer and one all-gather of
  // 32 bytes per rank. NCCL checks nothing, and a send/recv size mismatch
  // hangs or corrupts device memory. Turn off only for a plan source proven
  // consistent. Must be the same on every rank.
  bool check_counts = true;
  // Every wait of the transport ends by then: a collective not finished
  // this long after it was enqueued (a peer gone or stalled) aborts the
  // communicators and breaks the transport.
  absl::Duration timeout = absl::Minutes(10);
  // The stream the caller produces `send` on and reads `recv` from (e.g.
  // PyTorch's current stream, at::cuda::getCurrentCUDAStream). Called on
  // every exchange. Empty: the device's legacy default stream (stream 0,
  // PyTorch's current stream unless the caller sets another), so that an
  // exchange is ordered after what the trainer queued there and before what
  // it queues next; never the transport's own stream alone, which nothing
  // of the trainer's would be ordered with.
  std::function<cudaStream_t()> caller_stream;
};

// Device buffers: AllToAll takes pointers on the communicator's CUDA
// device. Stream order, not host syncs: each exchange's NCCL group runs on
// the transport's stream after an event recorded on the caller's stream
// (so the kernel that filled `send` has ended, and memory the caching
// allocator hands out on the caller's stream is not touched early), and the
// caller's stream waits for an event recorded after it (so nothing reads
// `recv`, or frees and reuses `send`, before the exchange ends). The data
// all-to-all therefore returns without waiting for the GPU; only what the
// host must read (the row-count check, AllGatherBytes, a subgroup's id)
// waits, by polling an event against the timeout.
//
// Failure. A background watchdog polls every enqueued exchange and
// ncclCommGetAsyncError. On a CUDA or NCCL error, or when an exchange or a
// host wait passes `timeout`, the communicator is aborted (once: this
// stops kernels waiting for a dead peer), the transport is broken, and
// every later call fails fast with Unavailable naming the first failure.
// That includes a communicator the trainer passed in: after
// `aborted()` the trainer must not destroy it again. An InvalidArgument
// from the argument or count checks breaks nothing: every rank returns it
// before any row moves.
//
// Not thread-safe: one thread calls a given transport at a time, which is
// also what NCCL requires of a communicator.
class NcclTransport final : public Transport {
 public:
  // Over the trainer's communicator, which it keeps owning: it must outlive
  // the transport and is never destroyed here. `stream` must be on the
  // communicator's device (checked) and outlive the transport. REQUIRES:
  // `comm` is initialised (a non-blocking one has finished ncclCommInitRank).
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(ncclComm_t comm, cudaStream_t stream,
                                                               NcclTransportOptions options = {});

  // Joins a new communicator of `size` ranks (ncclCommInitRank; every rank
  // calls it with the same `id`, made by one of them with ncclGetUniqueId and
  // shared out of band) on CUDA device `device`, which the transport owns.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> CreateFromUniqueId(
      const ncclUniqueId& id, int rank, int size, int device, cudaStream_t stream,
      NcclTransportOptions options = {});

  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;
  // Destroys the communicator only if this transport created it and it was
  // not aborted. Work still enqueued is not waited for.
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int cuda_device() const override { return device_; }
  // True once a failure aborted the communicator.
  bool aborted() const { return aborted_.load(); }
  int device() const { return device_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

  // The count check alone (row sizes are not compared: each later call's
  // may differ).
  absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) override;
  // Host strings in and out (staged through a device buffer, padded to the
  // longest, since ncclAllGather moves equal sizes).
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override;

  // A new communicator over `ranks`, owned by the returned transport, on the
  // same device and stream, with the same options. Refused (FailedPrecondition)
  // while NCCL_COMM_ID is set: every ncclGetUniqueId then names that one
  // address, and bags created together would join each other. Only the members call it, as the interface says,
  // so it cannot use ncclCommSplit: that is collective over the whole parent
  // (every parent rank would have to call it, non-members with
  // NCCL_SPLIT_NOCOLOR) and would hang here. Instead the first member makes
  // an ncclUniqueId and sends its 128 bytes to the other members over the
  // parent (ncclSend/ncclRecv, point-to-point, so non-members take no part),
  // and the members join with ncclCommInitRank.
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override;

 protected:
  // `send` and `recv` are device pointers (null only when there is nothing
  // to move). Rows travel as bytes: one ncclSend/ncclRecv per peer with a
  // non-zero count, all in one NCCL group.
  absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool counts_checked) override;

 private:
  NcclTransport(ncclComm_t comm, bool owned, cudaStream_t stream, int rank, int size, int device,
                NcclTransportOptions options);
  // Creates the watchdog and events: Internal/ResourceExhausted on failure.
  absl::Status Start();

  // Ok, or Unavailable naming the failure that broke the transport.
  absl::Status Usable() const;
  // Breaks the transport on anything but InvalidArgument (which every rank
  // returns alike before moving anything).
  void NoteFailure(const absl::Status& status);
  // Aborts the communicator, once (the watchdog's on_failure).
  void Abort();

  absl::Status DoAllToAllRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                              const std::vector<int64_t>& recv_rows, int64_t row_bytes);
  absl::StatusOr<std::vector<std::string>> DoAllGatherBytes(absl::string_view mine);
  absl::StatusOr<std::unique_ptr<Transport>> DoSubgroup(const std::vector<int>& ranks,
                                                        int my_index);

  // The count check; a rank whose own arguments are bad (`refuse`) still
  // takes part, so that every rank fails it together.
  absl::Status CheckCounts(const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes, bool refuse);
  absl::StatusOr<std::vector<int64_t>> ExchangeCounts(const std::vector<int64_t>& send_rows);
  // Every rank's `mine` (the same length on every rank), by rank.
  absl::StatusOr<std::vector<int64_t>> AllGatherInt64(const std::vector<int64_t>& mine);
  absl::StatusOr<ncclUniqueId> ShareUniqueId(const std::vector<int>& ranks, int my_index);

  // Enqueues `ops` (which return a status) as one NCCL group on stream_,
  // after the caller's stream.
  template <typename Ops>
  absl::Status Group(const char* what, Ops&& ops);
  // Makes the caller's stream wait for everything enqueued on stream_ so
  // far, and the watchdog watch it against the timeout.
  absl::Status Publish(const char* what);
  // Waits on the host, polling, until stream_ has run everything enqueued.
  absl::Status WaitHost(const char* what);
  // A device buffer of at least `bytes` on the stream, reused across calls.
  absl::StatusOr<char*> Scratch(size_t bytes);
  // A pinned host buffer of at least `bytes` (device-to-host copies into
  // pageable memory would block the thread in the driver, past any timeout).
  absl::StatusOr<char*> Staging(size_t bytes);
  cudaStream_t CallerStream() const;

  ncclComm_t comm_;
  const bool owned_;
  cudaStream_t stream_;
  const int rank_;
  const int size_;
  const int device_;
  NcclTransportOptions options_;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  char* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  cudaEvent_t caller_ready_ = nullptr;
  std::atomic<bool> aborted_{false};
  // The events Publish and WaitHost record, reused (before the watchdog,
  // which gives them back: destroyed after it).
  ResourcePool<cudaEvent_t> events_;
  std::unique_ptr<DeadlineWatchdog> watchdog_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_
