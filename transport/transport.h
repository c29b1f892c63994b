#ifndef KNAPFORMER_TRANSPORT_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knapformer {

// The collectives the client library needs, over one group of ranks, on
// host or device memory depending on the backend. Like c10d, every rank of
// the group must call the same collectives in the same order; a failed
// collective (a peer gone, a timeout) leaves the group unusable (the c10d
// and NCCL backends then fail every later call fast with Unavailable). An InvalidArgument returned before
// anything moved (a bad count, a null buffer) leaves it usable. Implementations check what the
// wire does not: the rows a rank expects from each peer must equal the rows
// that peer sends it (InvalidArgument otherwise), so a plan bug is an error,
// never uninitialised or lost rows.
// The error every backend returns, on every rank, when the counts disagree:
// `receiver` expects `expected` rows from `sender`, which sends it `sent`.
absl::Status RecvRowsMismatch(int receiver, int sender, int64_t expected, int64_t sent);

// InvalidArgument unless send_rows and recv_rows both have one entry per
// rank of a group of `group_size`: every backend's first check.
absl::Status CheckRowVectorSizes(const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& recv_rows, int group_size);

// The local checks every backend makes of an all-to-all before anything
// moves: one count per rank on each side, no negative count, row_bytes >= 0,
// and neither side's bytes beyond int64 (NCCL's size_t counts would wrap).
// InvalidArgument naming the field otherwise.
absl::Status CheckExchange(const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                           int group_size);

// InvalidArgument when `send` or `recv` is null but rows are to move through
// it. REQUIRES: CheckExchange passed.
absl::Status CheckBuffers(const void* send, const std::vector<int64_t>& send_rows,
                          const void* recv, const std::vector<int64_t>& recv_rows,
                          int64_t row_bytes);

// The sum of `rows`. REQUIRES: CheckExchange passed (no overflow).
int64_t TotalRows(const std::vector<int64_t>& rows);

// One message of Transport::ExchangeSegments: `bytes` bytes from `data`
// to `peer`, or from `peer` into `data`.
struct SendSegment {
  int peer = 0;
  const void* data = nullptr;
  int64_t bytes = 0;
};
struct RecvSegment {
  int peer = 0;
  void* data = nullptr;
  int64_t bytes = 0;
};

// InvalidArgument unless every segment names a peer of the group other than
// `rank`, with bytes >= 0 and data where bytes > 0: ExchangeSegments' first
// check in every backend.
absl::Status CheckSegments(const std::vector<SendSegment>& sends,
                           const std::vector<RecvSegment>& recvs, int rank, int size);

// InvalidArgument unless 0 <= root < size: BroadcastBytes' first check in
// every backend.
absl::Status CheckBroadcastRoot(int root, int size);

// `rank`'s index in `ranks`, a subgroup of a group of `size`: InvalidArgument
// unless they ascend within [0, size) and contain `rank`. Every backend's
// first check in Subgroup().
absl::StatusOr<int> IndexInSubgroup(const std::vector<int>& ranks, int rank, int size);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of AllToAllRows live: the index of a CUDA device, or
  // -1 for host memory. Callers check their tensors against it before any
  // pointer reaches the backend (a host pointer handed to NCCL is an
  // illegal address that poisons the CUDA context).
  virtual int cuda_device() const { return -1; }

  // Variable-split all-to-all of rows of `row_bytes` bytes. `send` holds
  // send_rows[0] rows for rank 0, then send_rows[1] for rank 1, ...;
  // `recv` receives recv_rows[p] rows from each rank p, in rank order. Both
  // buffers are contiguous. REQUIRES: send_rows.size() == recv_rows.size() ==
  // size().
  virtual absl::Status AllToAllRows(const void* send, const std::vector<int64_t>& send_rows,
                                    void* recv, const std::vector<int64_t>& recv_rows,
                                    int64_t row_bytes) = 0;

  // Collective: checks that the rows every rank expects from each peer equal
  // the rows that peer sends it; otherwise the same InvalidArgument, naming
  // the receiver and the sender, on every rank. The default uses one
  // all-to-all of counts and one all-gather of the verdicts.
  virtual absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                                      const std::vector<int64_t>& recv_rows);

  // AllToAllRows for counts that CheckRowCounts has accepted on every rank
  // (or their transpose, the way back): backends may skip their own
  // per-call cross-check, which costs two small collectives. A caller that
  // moves many tensors under one plan checks once. The default is
  // AllToAllRows.
  virtual absl::Status AllToAllRowsPrechecked(const void* send,
                                              const std::vector<int64_t>& send_rows, void* recv,
                                              const std::vector<int64_t>& recv_rows,
                                              int64_t row_bytes) {
    return AllToAllRows(send, send_rows, recv, recv_rows, row_bytes);
  }

  // AllToAllRowsPrechecked that also carries one status byte from every
  // rank to every rank of the group: `mine` from this one, and `flags`
  // receives each rank's (by rank, this rank's own included). For callers
  // that agree on an exchange's shape once and run the later ones without a
  // collective of their own: a rank that cannot take part (its tensors differ
  // from what was agreed, an allocation failed) still moves the agreed bytes,
  // from scratch memory, with a non-zero flag, so that every rank learns in
  // this same call that the exchange failed somewhere, and nobody waits.
  // Where the backend moves segments, this is one ExchangeSegments of each
  // peer's rows (this rank's own one memcpy): the flags travel with the
  // rows, no collective of their own. Otherwise AllToAllRowsPrechecked
  // followed by an AllGatherBytes of the flag. REQUIRES: counts accepted by
  // CheckRowCounts, as for AllToAllRowsPrechecked; flags != nullptr.
  virtual absl::Status AllToAllRowsFlagged(const void* send, const std::vector<int64_t>& send_rows,
                                           void* recv, const std::vector<int64_t>& recv_rows,
                                           int64_t row_bytes, uint8_t mine,
                                           std::vector<uint8_t>* flags);

  // Whether ExchangeSegments is implemented: rows then travel from where
  // they lie and land where they belong, without a contiguous staging
  // buffer per exchange. Such backends move host memory (a caller copies
  // its own rows with memcpy).
  virtual bool MovesSegments() const { return false; }

  // Collective over the group, for exchanges whose counts every rank has
  // agreed (as AllToAllRowsPrechecked): every segment is one message; the
  // i-th segment this rank sends to peer p pairs with the i-th segment p
  // receives from this rank, and both have the same bytes. No segment goes
  // to or comes from this rank itself (its own rows are the caller's copy).
  // With `flags`, every rank's `mine` arrives as AllToAllRowsFlagged's do;
  // without, none is sent. `row_bytes` is informational (wrappers record
  // it). Unimplemented unless MovesSegments().
  virtual absl::Status ExchangeSegments(const std::vector<SendSegment>& sends,
                                        const std::vector<RecvSegment>& recvs,
                                        int64_t row_bytes, uint8_t mine,
                                        std::vector<uint8_t>* flags);

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
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_TRANSPORT_H_
