#ifndef KNAPFORMER_TRANSPORT_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/segments.h"

namespace knapformer {

// The collectives the client library needs, over one group of ranks, on
// host or device memory depending on the backend. Like c10d, every rank of
// the group must call the same collectives in the same order; a failed
// collective (a peer gone, a timeout) leaves the group unusable (the c10d
// and NCCL backends then fail every later call fast with Unavailable). An
// InvalidArgument returned before anything moved (a bad count, a null
// buffer) leaves it usable. Implementations check what the wire does not:
// the rows a rank expects from each peer must equal the rows that peer
// sends it (InvalidArgument otherwise), so a plan bug is an error, never
// uninitialised or lost rows. Their shared local checks are
// backend_checks.h's.

// How one Transport::AllToAll runs. The default: a checked all-to-all of
// contiguous buffers.
struct AllToAllOptions {
  // The counts were accepted by CheckRowCounts on every rank (or are the
  // transpose of accepted ones, the way back): the backend skips its own
  // per-call cross-check, which costs two small collectives. A caller that
  // moves many tensors under one plan checks once.
  bool counts_checked = false;
  // Non-null: one status byte travels from every rank to every rank with the
  // rows: `flag` from this one, and `flags` receives each rank's (by rank,
  // this rank's own included). For callers that agree on an exchange's shape
  // once and run the later ones without a collective of their own: a rank
  // that cannot take part (its tensors differ from what was agreed, an
  // allocation failed) still moves the agreed bytes, from scratch memory,
  // with a non-zero flag, so that every rank learns in this same call that
  // the exchange failed somewhere, and nobody waits. Where the backend moves
  // segments, the flags travel with the rows (each peer's rows one segment
  // each way, this rank's own one memcpy); otherwise the rows move, then an
  // AllGatherBytes of the flag. REQUIRES: counts_checked.
  std::vector<uint8_t>* flags = nullptr;
  uint8_t flag = 0;
  // Non-null (only where MovesSegments()): the rows travel as these messages
  // instead of from `send` into `recv`, from where they lie to where they
  // belong, without a contiguous staging buffer. The i-th segment this rank
  // sends to peer p pairs with the i-th segment p receives from this rank,
  // and both have the same bytes; none goes to or comes from this rank
  // itself (its own rows are the caller's copy). `send` and `recv` are then
  // unused and `send_rows`, `recv_rows` and `row_bytes` informational
  // (wrappers record them). REQUIRES: counts_checked; both set.
  const std::vector<SendSegment>* send_segments = nullptr;
  const std::vector<RecvSegment>* recv_segments = nullptr;

  // Counts accepted by CheckRowCounts (counts_checked).
  static AllToAllOptions Checked() {
    AllToAllOptions options;
    options.counts_checked = true;
    return options;
  }
  // Checked, with this rank's `mine` and every rank's flags into `flags`.
  static AllToAllOptions Flagged(uint8_t mine, std::vector<uint8_t>* flags) {
    AllToAllOptions options = Checked();
    options.flag = mine;
    options.flags = flags;
    return options;
  }
  // Checked, moving these segments; with `flags`, flagged too.
  static AllToAllOptions Segments(const std::vector<SendSegment>* sends,
                                  const std::vector<RecvSegment>* recvs, uint8_t mine = 0,
                                  std::vector<uint8_t>* flags = nullptr) {
    AllToAllOptions options = Flagged(mine, flags);
    options.send_segments = sends;
    options.recv_segments = recvs;
    return options;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of AllToAll live: the index of a CUDA device, or
  // -1 for host memory. Callers check their tensors against it before any
  // pointer reaches the backend (a host pointer handed to NCCL is an
  // illegal address that poisons the CUDA context).
  virtual int cuda_device() const { return -1; }

  // The all-to-all of rows of `row_bytes` bytes, run as `options` say (a
  // checked exchange of contiguous buffers by default). `send` holds
  // send_rows[0] rows for rank 0, then send_rows[1] for rank 1, ...; `recv`
  // receives recv_rows[p] rows from each rank p, in rank order. REQUIRES:
  // send_rows.size() == recv_rows.size() == size(). Backends implement
  // MoveRows and, where they can, MoveSegments; wrappers override this.
  virtual absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_rows,
                                void* recv, const std::vector<int64_t>& recv_rows,
                                int64_t row_bytes, const AllToAllOptions& options = {});

  // Collective: checks that the rows every rank expects from each peer equal
  // the rows that peer sends it; otherwise the same InvalidArgument, naming
  // the receiver and the sender, on every rank (the verdict of
  // agreement.h's JudgeVerdicts, which every backend uses). The default
  // (agreement.cc) uses one all-to-all of counts and one all-gather of the
  // verdicts.
  virtual absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                                      const std::vector<int64_t>& recv_rows);

  // Whether the backend moves segments (AllToAllOptions::Segments): rows
  // then travel from where they lie and land where they belong. Such
  // backends move host memory (a caller copies its own rows with memcpy).
  virtual bool MovesSegments() const { return false; }

  // This backend's own limits on one all-to-all, beyond CheckExchange (c10d:
  // elements per call); Ok by default. Local: callers that agree on every
  // rank's verdict before an exchange fold it in, so that a limit one rank
  // hits fails every rank.
  virtual absl::Status CheckLimits(const std::vector<int64_t>& /*send_rows*/,
                                   const std::vector<int64_t>& /*recv_rows*/,
                                   int64_t /*row_bytes*/) const {
    return absl::OkStatus();
  }

  // Every rank's `mine`, by rank (small metadata: sequence lengths, flags).
  virtual absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) = 0;

  // `root`'s `mine` on every rank (the others' `mine` is ignored): a group
  // leader's answer (a plan's chunk table) to its group. InvalidArgument,
  // before anything moves, unless 0 <= root < size(). The default is an
  // AllGatherBytes in which the other ranks send nothing; backends override
  // it where a broadcast moves fewer bytes.
  virtual absl::StatusOr<std::string> BroadcastBytes(int root, absl::string_view mine);

  // A transport over `ranks` (ranks of this group, ascending, containing
  // this rank), numbered 0.. in that order. Only the member ranks call it, all
  // with the same list.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) = 0;

 protected:
  // The backend's all-to-all of contiguous buffers, as AllToAll describes;
  // it cross-checks the counts with its peers unless `counts_checked`.
  virtual absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows,
                                void* recv, const std::vector<int64_t>& recv_rows,
                                int64_t row_bytes, bool counts_checked) = 0;

  // The backend's segment all-to-all (AllToAllOptions::Segments), with
  // `flags` (null: none) as AllToAllOptions::flags. Unimplemented unless
  // MovesSegments().
  virtual absl::Status MoveSegments(const std::vector<SendSegment>& sends,
                                    const std::vector<RecvSegment>& recvs, int64_t row_bytes,
                                    uint8_t mine, std::vector<uint8_t>* flags);

 private:
  // AllToAll with options.flags set.
  absl::Status MoveRowsFlagged(const void* send, const std::vector<int64_t>& send_rows,
                               void* recv, const std::vector<int64_t>& recv_rows,
                               int64_t row_bytes, uint8_t mine, std::vector<uint8_t>* flags);
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_TRANSPORT_H_
