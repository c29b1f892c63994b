#ifndef KNAPFORMER_TRANSPORT_EXCHANGE_PLAN_H_
#define KNAPFORMER_TRANSPORT_EXCHANGE_PLAN_H_

// What the raw NCCL transport decides on the host, apart from CUDA so that
// CPU tests run it: the send/recv pairs of an all-to-all. (Its row-count
// verdicts are agreement.h's, every backend's.)

#include <cstdint>
#include <vector>

namespace knapformer {

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
