#ifndef KNAPFORMER_TRANSPORT_TENSOR_HUB_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_TENSOR_HUB_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "absl/time/time.h"
#include "transport/local_transport.h"
#include "transport/transport.h"

namespace knapformer {

// A Transport between threads of one process whose rows stay where they
// are, on one device: AllToAll copies the rows each peer sends this
// rank straight from that peer's send buffer into this rank's receive
// buffer with torch's copy_ on the device (device to device on a GPU), after
// one hub round that names every rank's buffer and counts. It lets one GPU
// play the layout of several ranks (the GPU check's hub_layout: the device
// exchange path of 8 ranks, bags included, where NCCL refuses two ranks on
// one GPU) and a CPU test the same code.
//
// Ordering. The copies are queued on the calling thread's current stream;
// every rank's thread must use the same stream (the device's default one
// unless the caller sets one), so that a buffer's writers, the copies and
// its readers are in one stream order. A last hub round keeps every sender's
// buffer alive until each peer has queued its copies from it.
class TensorHubTransport final : public Transport {
 public:
  // One transport per rank of a new hub of `size` ranks on `device`.
  static std::vector<std::unique_ptr<TensorHubTransport>> CreateGroup(
      int size, c10::Device device, absl::Duration timeout = absl::Seconds(60));

  TensorHubTransport(std::shared_ptr<LocalHub> hub, int rank, c10::Device device)
      : hub_(std::move(hub)), rank_(rank), device_(device) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  int cuda_device() const override { return device_.is_cuda() ? device_.index() : -1; }
  // One hub round of every rank's counts, compared on the host. The base
  // class's check is an all-to-all of host memory, which this transport's
  // device copies cannot read on a GPU.
  absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) override;
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override;
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override;

 protected:
  // Row counts that differ from a peer's are the same InvalidArgument on
  // every rank, and nothing is copied; checked always (the copies read the
  // senders' buffers by them).
  absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool counts_checked) override;

 private:
  std::shared_ptr<LocalHub> hub_;
  const int rank_;
  const c10::Device device_;
  uint64_t round_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_TENSOR_HUB_TRANSPORT_H_
