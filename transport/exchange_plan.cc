#include "transport/exchange_plan.h"

#include <cstddef>

namespace knapformer {

std::vector<PeerTransfer> PeerTransfers(const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& recv_rows,
                                        int64_t row_bytes) {
  std::vector<PeerTransfer> transfers;
  int64_t send_offset = 0, recv_offset = 0;
  for (size_t p = 0; p < send_rows.size(); ++p) {
    const int64_t send_bytes = send_rows[p] * row_bytes;
    const int64_t recv_bytes = recv_rows[p] * row_bytes;
    if (send_bytes > 0 || recv_bytes > 0) {
      transfers.push_back(
          {static_cast<int>(p), send_offset, send_bytes, recv_offset, recv_bytes});
    }
    send_offset += send_bytes;
    recv_offset += recv_bytes;
  }
  return transfers;
}

}  // namespace knapformer
