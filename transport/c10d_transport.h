#ifndef KNAPFORMER_TRANSPORT_C10D_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_C10D_TRANSPORT_H_

// The transport over a LibTorch c10d ProcessGroup: Gloo on CPU (Debian's
// libtorch-dev), NCCL with a CUDA build of LibTorch. The trainer passes its
// own process group. Includes c10d's headers (~6 s per translation unit):
// include it only where the transport is built.
//
// Errors. A collective still unfinished at the transport's own
// collective_timeout is DeadlineExceeded; one the backend fails (Gloo: a
// peer gone, the group's timeout; NCCL with blocking wait: the timeout) is
// Unavailable with c10d's text. Either way the transport refuses every later
// call with that status. With ProcessGroupNCCL and no blocking wait
// (TORCH_NCCL_BLOCKING_WAIT / NCCL_BLOCKING_WAIT unset) work->wait() only
// orders the current stream after the collective: a dead peer is then found
// by torch's own watchdog, which aborts the communicator and ends the
// process after the group's timeout, and never comes back here as a status.
// Set blocking wait for errors as statuses (docs/client.md).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace knapformer {

// Makes the process group of a subgroup. `global_ranks` are ranks of the
// root group (ascending, containing this process), `rank` is this process's
// index in them. Only the members call it, each with the same list; a list
// may be asked for more than once (each call is a new group).
using SubgroupFactory = std::function<c10::intrusive_ptr<c10d::ProcessGroup>(
    const std::vector<int>& global_ranks, int rank)>;

struct C10dTransportOptions {
  // Where the buffers given to AllToAll live: CPU for Gloo, the rank's
  // CUDA device for NCCL. Every tensor handed to `group` is on this device
  // (ProcessGroupNCCL refuses CPU tensors); AllToAll refuses nothing
  // itself, so its callers check their buffers against cuda_device().
  c10::Device device = c10::Device(c10::kCPU);
  // Optional: a CPU (Gloo) group over the same ranks, in the same order, for
  // the small host-side collectives (row-count checks, AllGatherBytes and so
  // the client's error agreement). Without it they run on `group` on
  // `device`, which for NCCL means a device round trip and a host sync each.
  c10::intrusive_ptr<c10d::ProcessGroup> host_group;
  // Cross-check every all-to-all's row counts against the peers' (one small
  // all-to-all and one all-gather of 32 bytes per rank). c10d checks none:
  // Gloo leaves rows uninitialised on too few and aborts the process on too
  // many. Turn off only for a plan source proven consistent. An all-to-all
  // with AllToAllOptions::counts_checked never checks (its caller has, once
  // per plan).
  bool check_counts = true;
  // How long a collective waits for every rank before the transport gives up
  // on it (DeadlineExceeded naming this bound). Infinite: the group's own
  // timeout governs, and c10d reports it (Unavailable, with its text). Keep
  // it under the group's timeout for timeouts as their own status code.
  // For CPU (Gloo) groups: on a CUDA group torch's work then waits on the
  // host for the collective to finish (a host sync every call), which the
  // unbounded wait does not.
  absl::Duration collective_timeout = absl::InfiniteDuration();
  // Required for Subgroup(); with host_group, new_host_subgroup too.
  SubgroupFactory new_subgroup;
  SubgroupFactory new_host_subgroup;
};

class C10dTransport : public Transport {
 public:
  // `group` is the trainer's process group (its ranks are this transport's).
  static absl::StatusOr<std::unique_ptr<C10dTransport>> Create(
      c10::intrusive_ptr<c10d::ProcessGroup> group, C10dTransportOptions options);

  int rank() const override;
  int size() const override;
  int cuda_device() const override;
  absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) override;
  // On the CPU (Gloo): every segment a point-to-point message, all posted
  // at once (and so a flagged all-to-all's flags go beside the rows). On a
  // CUDA device: false, and flagged all-to-alls take their flags in a host
  // all-gather.
  bool MovesSegments() const override { return options_.device.is_cpu(); }
  // LibTorch 1.13 counts a collective's elements in int: at most 2^31 - 1
  // elements of the widest integer type dividing row_bytes per call.
  absl::Status CheckLimits(const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows,
                           int64_t row_bytes) const override;
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override;
  // Two c10d broadcasts (a 4 KiB head with the length, then the rest), or
  // one when the bytes fit in the head: no rank receives more than the
  // root's bytes.
  absl::StatusOr<std::string> BroadcastBytes(int root, absl::string_view mine) override;
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override;

  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }

 protected:
  absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool counts_checked) override;
  absl::Status MoveSegments(const std::vector<SendSegment>& sends,
                            const std::vector<RecvSegment>& recvs, int64_t row_bytes,
                            uint8_t mine, std::vector<uint8_t>* flags) override;

 private:
  C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> group,
                c10::intrusive_ptr<c10d::ProcessGroup> host_group, C10dTransportOptions options,
                std::vector<int> global_ranks);
  // The count check; a rank whose own arguments are bad (`refuse`) still
  // takes part with a refusing verdict, so that every rank fails it together.
  absl::Status DoCheckRowCounts(const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows, bool refuse);
  absl::StatusOr<std::vector<std::string>> DoAllGatherBytes(absl::string_view mine);
  absl::StatusOr<std::string> DoBroadcastBytes(int root, absl::string_view mine);
  // Broadcasts `tensor` (on the metadata device) from `root`, in place.
  absl::Status BroadcastFrom(at::Tensor& tensor, int root, const char* op);
  absl::Status RunAllToAll(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                           bool check_counts);
  // Runs one collective to completion; its exceptions become a status, and
  // any failure but InvalidArgument breaks the transport.
  template <typename Collective>
  absl::Status Run(const char* op, Collective&& collective);
  absl::Status Usable() const;
  // `mine` (same shape on every rank) from every rank of the metadata group
  // as one [size, ...] host tensor: one collective and one copy to the host.
  absl::StatusOr<at::Tensor> GatherToHost(const at::Tensor& mine, const char* op);
  // The group and device of the host-side collectives.
  c10d::ProcessGroup& metadata_group() const { return host_group_ ? *host_group_ : *group_; }
  c10::Device metadata_device() const {
    return host_group_ ? c10::Device(c10::kCPU) : options_.device;
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  c10::intrusive_ptr<c10d::ProcessGroup> host_group_;  // may be null
  C10dTransportOptions options_;
  std::vector<int> global_ranks_;  // of the root group, by this group's rank
  absl::Status broken_;            // the first failed collective
  // Segment exchanges so far: their messages' tags (every rank counts the
  // same, as every rank makes the same calls in the same order).
  uint32_t flagged_round_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_C10D_TRANSPORT_H_
