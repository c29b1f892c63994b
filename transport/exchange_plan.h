#ifndef KNAPFORMER_TRANSPORT_EXCHANGE_PLAN_H_
#define KNAPFORMER_TRANSPORT_EXCHANGE_PLAN_H_

// What the raw NCCL transport decides on the host, apart from CUDA so that
// CPU tests run it: the verdicts of the row-count check and the one error
// every rank derives from them, and the send/recv pairs of an all-to-all.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace knapformer {

// A rank's report after the count exchange: its first disagreeing
// (receiver, sender) pair as receiver * size + sender (kNoMismatch when
// none), the rows it expected and got there, and its row size.
inline constexpr int kVerdictFields = 4;

// `sent_to_me[p]`: the rows peer p says it sends this rank.
std::vector<int64_t> CountVerdict(int rank, int size, const std::vector<int64_t>& sent_to_me,
                                  const std::vector<int64_t>& recv_rows, int64_t row_bytes);

// The verdict of a rank that cannot take part (its own arguments are bad):
// a mismatch no real count produces, so every rank fails the check.
std::vector<int64_t> RefusingVerdict(int rank, int size);

// The same status on every rank, from every rank's verdict (kVerdictFields
// each, by rank): a refusing rank, else the first differing row size, else
// the disagreement with the smallest receiver, then sender, else Ok.
absl::Status JudgeVerdicts(const std::vector<int64_t>& verdicts, int size);

// One peer's share of an all-to-all in byte offsets into the packed
// buffers; pairs with nothing either way are left out, so both sides of an
// agreed plan skip the same peers and no null buffer reaches NCCL.
struct PeerTransfer {
  int peer = 0;
  int64_t send_offset = 0, send_bytes = 0;
  int64_t recv_offset = 0, recv_bytes = 0;
};

// REQUIRES: CheckExchange passed.
std::vector<PeerTransfer> PeerTransfers(const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& recv_rows, int64_t row_bytes);

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_EXCHANGE_PLAN_H_
