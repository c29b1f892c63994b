#include "transport/transport.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/backend_checks.h"

namespace knapformer {

absl::Status Transport::AllToAll(const void* send, const std::vector<int64_t>& send_rows,
                                 void* recv, const std::vector<int64_t>& recv_rows,
                                 int64_t row_bytes, const AllToAllOptions& options) {
  if (options.send_segments != nullptr || options.recv_segments != nullptr) {
    if (options.send_segments == nullptr || options.recv_segments == nullptr ||
        !options.counts_checked) {
      return absl::InvalidArgumentError(
          "options: a segment all-to-all needs both segment lists and checked counts");
    }
    if (!MovesSegments()) {
      return absl::UnimplementedError(
          "options: segments, but this transport moves contiguous buffers only");
    }
    return MoveSegments(*options.send_segments, *options.recv_segments, row_bytes, options.flag,
                        options.flags);
  }
  if (options.flags != nullptr) {
    if (!options.counts_checked) {
      return absl::InvalidArgumentError("options: flags need checked counts");
    }
    return MoveRowsFlagged(send, send_rows, recv, recv_rows, row_bytes, options.flag,
                           options.flags);
  }
  return MoveRows(send, send_rows, recv, recv_rows, row_bytes, options.counts_checked);
}

absl::Status Transport::MoveRowsFlagged(const void* send, const std::vector<int64_t>& send_rows,
                                        void* recv, const std::vector<int64_t>& recv_rows,
                                        int64_t row_bytes, uint8_t mine,
                                        std::vector<uint8_t>* flags) {
  if (MovesSegments()) {
    if (absl::Status valid = CheckExchange(send_rows, recv_rows, row_bytes, size()); !valid.ok()) {
      return valid;
    }
    if (absl::Status valid = CheckBuffers(send, send_rows, recv, recv_rows, row_bytes);
        !valid.ok()) {
      return valid;
    }
    // Each peer's rows one segment each way, from and into their offsets.
    std::vector<SendSegment> sends;
    std::vector<RecvSegment> recvs;
    int64_t send_offset = 0, recv_offset = 0;
    for (int p = 0; p < size(); ++p) {
      const char* from = static_cast<const char*>(send) + send_offset * row_bytes;
      char* into = static_cast<char*>(recv) + recv_offset * row_bytes;
      if (p == rank()) {
        if (send_rows[p] > 0 && row_bytes > 0) std::memcpy(into, from, send_rows[p] * row_bytes);
      } else {
        if (send_rows[p] > 0) sends.push_back({p, from, send_rows[p] * row_bytes});
        if (recv_rows[p] > 0) recvs.push_back({p, into, recv_rows[p] * row_bytes});
      }
      send_offset += send_rows[p];
      recv_offset += recv_rows[p];
    }
    return MoveSegments(sends, recvs, row_bytes, mine, flags);
  }
  absl::Status moved = MoveRows(send, send_rows, recv, recv_rows, row_bytes,
                                /*counts_checked=*/true);
  if (!moved.ok()) return moved;
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherBytes(absl::string_view(reinterpret_cast<const char*>(&mine), 1));
  if (!all.ok()) return all.status();
  flags->assign(all->size(), 0);
  for (size_t p = 0; p < all->size(); ++p) {
    if ((*all)[p].size() != 1) {
      return absl::InternalError(absl::StrCat("flagged all-to-all: rank ", p, " sent ",
                                              (*all)[p].size(), " bytes as its flag, not 1"));
    }
    (*flags)[p] = static_cast<uint8_t>((*all)[p][0]);
  }
  return absl::OkStatus();
}

absl::Status Transport::MoveSegments(const std::vector<SendSegment>& /*sends*/,
                                     const std::vector<RecvSegment>& /*recvs*/,
                                     int64_t /*row_bytes*/, uint8_t /*mine*/,
                                     std::vector<uint8_t>* /*flags*/) {
  return absl::UnimplementedError("segments: this transport moves contiguous buffers only");
}

absl::StatusOr<std::string> Transport::BroadcastBytes(int root, absl::string_view mine) {
  if (absl::Status valid = CheckBroadcastRoot(root, size()); !valid.ok()) return valid;
  auto all = AllGatherBytes(rank() == root ? mine : absl::string_view());
  if (!all.ok()) return all.status();
  return std::move((*all)[root]);
}

}  // namespace knapformer
