#include "transport/exchange_plan.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "transport/transport.h"

namespace knapformer {
namespace {

constexpr int64_t kNoMismatch = std::numeric_limits<int64_t>::max();
// Row size of a rank that refuses: no real row size is negative.
constexpr int64_t kRefused = -1;

}  // namespace

std::vector<int64_t> CountVerdict(int rank, int size, const std::vector<int64_t>& sent_to_me,
                                  const std::vector<int64_t>& recv_rows, int64_t row_bytes) {
  for (int p = 0; p < size; ++p) {
    if (sent_to_me[p] != recv_rows[p]) {
      return {int64_t{rank} * size + p, recv_rows[p], sent_to_me[p], row_bytes};
    }
  }
  return {kNoMismatch, 0, 0, row_bytes};
}

std::vector<int64_t> RefusingVerdict(int rank, int /*size*/) {
  return {kNoMismatch, rank, 0, kRefused};
}

absl::Status JudgeVerdicts(const std::vector<int64_t>& verdicts, int size) {
  if (size <= 0 || verdicts.size() != static_cast<size_t>(size) * kVerdictFields) {
    return absl::InternalError(absl::StrCat("exchange verdicts: ", verdicts.size(),
                                            " fields for a group of ", size, " (", kVerdictFields,
                                            " per rank)"));
  }
  auto field = [&](int rank, int index) { return verdicts[rank * kVerdictFields + index]; };
  // What a peer sent is checked before it is read: a pair inside the group
  // (or none), a row size that is one or refused.
  const int64_t pairs = int64_t{size} * size;
  for (int p = 0; p < size; ++p) {
    const int64_t pair = field(p, 0);
    if ((pair < 0 || pair >= pairs) && pair != kNoMismatch) {
      return absl::InternalError(absl::StrCat("exchange verdicts: rank ", p, " names rank pair ",
                                              pair, ", outside a group of ", size));
    }
    if (field(p, 3) < kRefused) {
      return absl::InternalError(
          absl::StrCat("exchange verdicts: rank ", p, " sent a row size of ", field(p, 3)));
    }
  }
  for (int p = 0; p < size; ++p) {
    if (field(p, 3) == kRefused) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", p, " refused this all-to-all (its own arguments are invalid; it says why)"));
    }
  }
  for (int p = 1; p < size; ++p) {
    if (field(p, 3) != field(0, 3)) {
      return absl::InvalidArgumentError(absl::StrCat("row_bytes: rank 0 moves rows of ",
                                                     field(0, 3), " bytes, rank ", p, " of ",
                                                     field(p, 3)));
    }
  }
  int first = 0;
  for (int p = 1; p < size; ++p) {
    if (field(p, 0) < field(first, 0)) first = p;
  }
  const int64_t pair = field(first, 0);
  if (pair == kNoMismatch) return absl::OkStatus();
  return RecvRowsMismatch(static_cast<int>(pair / size), static_cast<int>(pair % size),
                          field(first, 1), field(first, 2));
}

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
