#ifndef KNAPFORMER_TRANSPORT_BACKEND_CHECKS_H_
#define KNAPFORMER_TRANSPORT_BACKEND_CHECKS_H_

// The local checks every transport backend makes of its arguments, before
// anything moves, so that each backend refuses alike: for the backends in
// transport/, not for callers of the interface.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/segments.h"

namespace knapformer {

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

// InvalidArgument unless every segment names a peer of the group other than
// `rank`, with bytes >= 0 and data where bytes > 0: a segment all-to-all's first
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

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_BACKEND_CHECKS_H_
