#ifndef KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_

// The transport over raw NCCL (no LibTorch): for trainers that hold an
// ncclComm_t of their own. Built only under `--config=cuda`
// (//transport:nccl_transport is empty otherwise and defines
// KNAPFORMER_HAVE_NCCL when it is not).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/transport.h"

namespace knapformer {

struct NcclTransportOptions {
  // Cross-check every all-to-all's row counts (and row sizes) against the
  // peers' first: one send/recv of 8 bytes per peer and one all-gather of
  // 32 bytes per rank. NCCL checks nothing, and a send/recv size mismatch
  // hangs or corrupts device memory. Turn off only for a plan source proven
  // consistent. Must be the same on every rank.
  bool check_counts = true;
};

// Device buffers: AllToAllRows takes pointers on the communicator's CUDA
// device. Every call ends with cudaStreamSynchronize on the transport's
// stream, because the Transport interface is synchronous (the caller reads
// `recv` and the gathered strings as soon as the call returns, and the count
// check must decide on the host before any row moves). Work queued on that
// stream before the call (e.g. the kernel that filled `send`) is ordered
// before it; other streams are the caller's to synchronise.
//
// Like NCCL itself there is no timeout: a peer that never calls leaves the
// others blocked in cudaStreamSynchronize (the trainer's watchdog, if any,
// must abort the communicator). After a CUDA or NCCL error the transport
// refuses further calls (FailedPrecondition naming the first error); an
// InvalidArgument from the count check leaves it usable, since every rank
// returns that same error before any row moves.
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
  // Destroys the communicator only if this transport created it (aborts it
  // instead after an error, since ncclCommDestroy may wait on a peer that is
  // gone).
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int device() const { return device_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

  // `send` and `recv` are device pointers (null only when there is nothing
  // to move). Rows travel as bytes: one ncclSend/ncclRecv per peer with a
  // non-zero count, all in one NCCL group.
  absl::Status AllToAllRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                            const std::vector<int64_t>& recv_rows, int64_t row_bytes) override;
  // The count check alone (row sizes are not compared: each later call's
  // may differ), and the all-to-all without it.
  absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) override;
  absl::Status AllToAllRowsPrechecked(const void* send, const std::vector<int64_t>& send_rows,
                                      void* recv, const std::vector<int64_t>& recv_rows,
                                      int64_t row_bytes) override;
  // Host strings in and out (staged through a device buffer, padded to the
  // longest, since ncclAllGather moves equal sizes).
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override;

  // A new communicator over `ranks`, owned by the returned transport, on the
  // same device and stream. Only the members call it, as the interface says,
  // so it cannot use ncclCommSplit: that is collective over the whole parent
  // (every parent rank would have to call it, non-members with
  // NCCL_SPLIT_NOCOLOR) and would hang here. Instead the first member makes
  // an ncclUniqueId and sends its 128 bytes to the other members over the
  // parent (ncclSend/ncclRecv, point-to-point, so non-members take no part),
  // and the members join with ncclCommInitRank.
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override;

 private:
  NcclTransport(ncclComm_t comm, bool owned, cudaStream_t stream, int rank, int size, int device,
                NcclTransportOptions options);

  // Ok, or FailedPrecondition naming the error that broke the transport.
  absl::Status Usable() const;
  // Remembers the first CUDA/NCCL error (anything but InvalidArgument,
  // which every rank returns alike before moving anything).
  void NoteFailure(const absl::Status& status);

  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool check_counts);
  absl::Status DoAllToAllRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                              const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                              bool check_counts);
  absl::StatusOr<std::vector<std::string>> DoAllGatherBytes(absl::string_view mine);
  absl::StatusOr<std::unique_ptr<Transport>> DoSubgroup(const std::vector<int>& ranks,
                                                        int my_index);

  absl::Status CheckCounts(const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes);
  absl::StatusOr<std::vector<int64_t>> ExchangeCounts(const std::vector<int64_t>& send_rows);
  // Every rank's `mine` (the same length on every rank), by rank.
  absl::StatusOr<std::vector<int64_t>> AllGatherInt64(const std::vector<int64_t>& mine);
  absl::StatusOr<ncclUniqueId> ShareUniqueId(const std::vector<int>& ranks, int my_index);

  // Enqueues `ops` (which return a status) as one NCCL group.
  template <typename Ops>
  absl::Status Group(const char* what, Ops&& ops);
  // Waits for the stream and surfaces NCCL's asynchronous errors.
  absl::Status Sync(const char* what);
  // A device buffer of at least `bytes` on the stream, reused across calls.
  absl::StatusOr<char*> Scratch(size_t bytes);

  ncclComm_t comm_;
  const bool owned_;
  cudaStream_t stream_;
  const int rank_;
  const int size_;
  const int device_;
  NcclTransportOptions options_;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  absl::Status broken_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_NCCL_TRANSPORT_H_
