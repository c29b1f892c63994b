#include "transport/backend_checks.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace knapformer {

absl::Status RecvRowsMismatch(int receiver, int sender, int64_t expected, int64_t sent) {
  return absl::InvalidArgumentError(absl::StrCat("recv_rows: rank ", receiver, " expects ",
                                                 expected, " rows from rank ", sender,
                                                 ", which sends it ", sent));
}

absl::Status CheckRowVectorSizes(const std::vector<int64_t>& send_rows,
                                 const std::vector<int64_t>& recv_rows, int group_size) {
  if (static_cast<int>(send_rows.size()) != group_size ||
      static_cast<int>(recv_rows.size()) != group_size) {
    return absl::InvalidArgumentError(absl::StrCat("send_rows/recv_rows: ", send_rows.size(), "/",
                                                   recv_rows.size(), " entries for a group of ",
                                                   group_size));
  }
  return absl::OkStatus();
}

namespace {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

absl::Status CheckSide(const std::vector<int64_t>& rows, int64_t row_bytes,
                       absl::string_view field) {
  int64_t total = 0;
  for (size_t p = 0; p < rows.size(); ++p) {
    if (rows[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", p, "]: ", rows[p], " rows; must be >= 0"));
    }
    if (rows[p] > kMaxInt64 - total) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": the total exceeds ", kMaxInt64));
    }
    total += rows[p];
  }
  if (row_bytes > 0 && total > kMaxInt64 / row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", total, " rows of ", row_bytes,
                                                   " bytes exceed ", kMaxInt64, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExchange(const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                           int group_size) {
  if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, group_size); !sizes.ok()) {
    return sizes;
  }
  if (row_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_bytes: ", row_bytes, "; must be >= 0"));
  }
  if (absl::Status send = CheckSide(send_rows, row_bytes, "send_rows"); !send.ok()) return send;
  return CheckSide(recv_rows, row_bytes, "recv_rows");
}

absl::Status CheckBuffers(const void* send, const std::vector<int64_t>& send_rows,
                          const void* recv, const std::vector<int64_t>& recv_rows,
                          int64_t row_bytes) {
  const int64_t send_bytes = TotalRows(send_rows) * row_bytes;
  const int64_t recv_bytes = TotalRows(recv_rows) * row_bytes;
  if (send == nullptr && send_bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("send: null, but ", send_bytes, " bytes are to move through it"));
  }
  if (recv == nullptr && recv_bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("recv: null, but ", recv_bytes, " bytes are to move through it"));
  }
  return absl::OkStatus();
}

int64_t TotalRows(const std::vector<int64_t>& rows) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  return total;
}

absl::StatusOr<int> IndexInSubgroup(const std::vector<int>& ranks, int rank, int size) {
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: [", absl::StrJoin(ranks, ","), "] must be ascending ranks of a group of ", size));
    }
    if (ranks[i] == rank) index = static_cast<int>(i);
  }
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks: [", absl::StrJoin(ranks, ","), "] does not contain rank ", rank));
  }
  return index;
}

absl::Status CheckSegments(const std::vector<SendSegment>& sends,
                           const std::vector<RecvSegment>& recvs, int rank, int size) {
  for (size_t i = 0; i < sends.size(); ++i) {
    const SendSegment& s = sends[i];
    if (s.peer < 0 || s.peer >= size || s.peer == rank || s.bytes < 0 ||
        (s.bytes > 0 && s.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sends[", i, "]: ", s.bytes, " bytes to peer ", s.peer, " (a peer other than rank ",
          rank, " of ", size, ", bytes >= 0, data set)"));
    }
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    const RecvSegment& r = recvs[i];
    if (r.peer < 0 || r.peer >= size || r.peer == rank || r.bytes < 0 ||
        (r.bytes > 0 && r.data == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recvs[", i, "]: ", r.bytes, " bytes from peer ", r.peer, " (a peer other than rank ",
          rank, " of ", size, ", bytes >= 0, data set)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastRoot(int root, int size) {
  if (root >= 0 && root < size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("root: ", root, " is outside the group's ranks [0, ", size, ")"));
}

}  // namespace knapformer
