#include "transport/agreement.h"

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

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

}  // namespace knapformer
