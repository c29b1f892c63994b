#include "transport/agreement.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "transport/backend_checks.h"

namespace knapformer {
namespace {

constexpr int64_t kNoMismatch = std::numeric_limits<int64_t>::max();
// Row size of a rank that refuses: no real row size is negative.
constexpr int64_t kRefused = -1;

int64_t RowBytesOf(const agreement::Verdict& verdict) {
  return verdict.has_row_bytes() ? verdict.row_bytes() : -1;
}

}  // namespace

absl::Status Malformed(int rank, const std::string& type) {
  return absl::InternalError(
      absl::StrCat("agreement: rank ", rank, " sent bytes that are not a ", type));
}

agreement::Verdict VerdictOf(const absl::Status& status, int64_t row_bytes) {
  agreement::Verdict verdict;
  verdict.set_code(static_cast<int32_t>(status.code()));
  verdict.set_message(std::string(status.message()));
  if (row_bytes >= 0) verdict.set_row_bytes(row_bytes);
  return verdict;
}

absl::Status CheckVerdict(const agreement::Verdict& verdict, int rank) {
  const int32_t code = verdict.code();
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError(absl::StrCat("agreement: rank ", rank, " sent status code ", code,
                                            ", which is none of absl's: ", verdict.message()));
  }
  if (verdict.has_row_bytes() && verdict.row_bytes() < 0) {
    return absl::InternalError(absl::StrCat("agreement: rank ", rank, " sent a row size of ",
                                            verdict.row_bytes(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Status StatusOf(const agreement::Verdict& verdict, int rank, const std::string& prefix) {
  if (absl::Status code = CheckVerdict(verdict, rank); !code.ok()) return code;
  if (verdict.code() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(verdict.code()), prefix + verdict.message());
}

absl::Status FirstFailure(const std::vector<agreement::Verdict>& verdicts, NameRank name) {
  for (size_t p = 0; p < verdicts.size(); ++p) {
    const int rank = static_cast<int>(p);
    absl::Status status =
        StatusOf(verdicts[p], rank, name == NameRank::kYes ? absl::StrCat("rank ", p, ": ") : "");
    if (!status.ok()) return status;
  }
  for (size_t p = 1; p < verdicts.size(); ++p) {
    if (RowBytesOf(verdicts[p]) != RowBytesOf(verdicts[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows of ", RowBytesOf(verdicts[0]), " bytes on rank 0 but ", RowBytesOf(verdicts[p]),
          " on rank ", p, ": every rank must pass the same dtypes and trailing shapes"));
    }
  }
  return absl::OkStatus();
}

absl::Status AgreeOnStatus(Transport& transport, const absl::Status& mine, int64_t row_bytes,
                           NameRank name) {
  absl::StatusOr<std::vector<agreement::Verdict>> all =
      AllGatherMessages(transport, VerdictOf(mine, row_bytes));
  if (!all.ok()) return all.status();
  return FirstFailure(*all, name);
}

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

std::string VerdictBytes(const std::vector<int64_t>& verdict) {
  return std::string(reinterpret_cast<const char*>(verdict.data()),
                     sizeof(int64_t) * verdict.size());
}

absl::Status JudgeVerdictBytes(const std::vector<std::string>& all) {
  std::vector<int64_t> verdicts(all.size() * kVerdictFields);
  for (size_t p = 0; p < all.size(); ++p) {
    if (all[p].size() != sizeof(int64_t) * kVerdictFields) {
      return Malformed(static_cast<int>(p), "row-count verdict");
    }
    std::memcpy(verdicts.data() + p * kVerdictFields, all[p].data(), all[p].size());
  }
  return JudgeVerdicts(verdicts, static_cast<int>(all.size()));
}

absl::Status Transport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                       const std::vector<int64_t>& recv_rows) {
  const int n = size();
  if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, n); !sizes.ok()) {
    return sizes;
  }
  // One count to each peer: these counts agree by construction (and a
  // checking all-to-all would call back here).
  std::vector<int64_t> ones(n, 1), sent_to_me(n, 0);
  absl::Status status = AllToAll(send_rows.data(), ones, sent_to_me.data(), ones,
                                 sizeof(int64_t), AllToAllOptions::Checked());
  if (!status.ok()) return status;
  // Everyone learns every rank's verdict, so that all return the same error
  // (the first disagreement), not only the rank that saw it.
  absl::StatusOr<std::vector<std::string>> all =
      AllGatherBytes(VerdictBytes(CountVerdict(rank(), n, sent_to_me, recv_rows, 0)));
  if (!all.ok()) return all.status();
  return JudgeVerdictBytes(*all);
}

}  // namespace knapformer
