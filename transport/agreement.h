#ifndef KNAPFORMER_TRANSPORT_AGREEMENT_H_
#define KNAPFORMER_TRANSPORT_AGREEMENT_H_

// Typed agreement over a Transport: every rank's message in one all-gather
// (or the root's in one broadcast), and every rank's verdict folded into
// one status that all ranks return. The one way the ranks of a group tell
// each other anything: every message is a protobuf message, every decoded
// status code is checked, and a rank's bytes that do not parse are an error
// naming that rank, the same on every rank (all decode the same bytes).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/agreement.pb.h"
#include "transport/transport.h"

namespace knapformer {

// Internal naming `rank` and the message type its bytes did not parse as.
absl::Status Malformed(int rank, const std::string& type);

// Collective over `transport`: every rank's `mine`, by rank. Errors: the
// transport's (a peer gone: Unavailable or DeadlineExceeded), or Malformed.
template <typename Message>
absl::StatusOr<std::vector<Message>> AllGatherMessages(Transport& transport, const Message& mine) {
  absl::StatusOr<std::vector<std::string>> all = transport.AllGatherBytes(mine.SerializeAsString());
  if (!all.ok()) return all.status();
  std::vector<Message> messages(all->size());
  for (size_t p = 0; p < all->size(); ++p) {
    if (!messages[p].ParseFromString((*all)[p])) {
      return Malformed(static_cast<int>(p), mine.GetTypeName());
    }
  }
  return messages;
}

// Collective over `transport`: `root`'s `mine` on every rank (the others'
// `mine` is not sent). Errors: InvalidArgument for a root outside the
// group (before anything moves), the transport's, or Malformed.
template <typename Message>
absl::StatusOr<Message> BroadcastMessage(Transport& transport, int root, const Message& mine) {
  absl::StatusOr<std::string> bytes =
      transport.BroadcastBytes(root, transport.rank() == root ? mine.SerializeAsString() : "");
  if (!bytes.ok()) return bytes.status();
  Message message;
  if (!message.ParseFromString(*bytes)) return Malformed(root, mine.GetTypeName());
  return message;
}

// `status` as a verdict; row_bytes < 0 leaves the row size unset.
agreement::Verdict VerdictOf(const absl::Status& status, int64_t row_bytes = -1);

// Internal naming `rank` unless the verdict's code is an absl::StatusCode
// and its row size, if set, is not negative.
absl::Status CheckVerdict(const agreement::Verdict& verdict, int rank);

// The status `verdict` carries (its code and message; `prefix` before the
// message, e.g. "rank 3: "), or CheckVerdict's error.
absl::Status StatusOf(const agreement::Verdict& verdict, int rank, const std::string& prefix = "");

// How a group's verdicts fold into one status.
enum class NameRank {
  kYes,  // the failing rank's message is prefixed "rank R: "
  kNo,   // as it is (it names the ranks itself)
};

// The lowest failing rank's status among `verdicts` (by rank); else, when
// some carry row sizes and they differ, InvalidArgument naming the first
// rank whose size differs from rank 0's; else Ok.
absl::Status FirstFailure(const std::vector<agreement::Verdict>& verdicts,
                          NameRank name = NameRank::kYes);

// Collective over `transport`: every rank's local verdict on the collective
// it is about to enter (`mine`: Ok or why it cannot take part; `row_bytes`:
// the bytes per row it would move, or -1 when the exchange has no single
// row size) in one small all-gather, so that all ranks return the same
// status: FirstFailure of them. A rank that would fail alone would leave
// its peers waiting in the collective until a timeout; this turns that into
// the same immediate error everywhere.
//
// If the all-gather itself fails (a peer gone, a broken transport), that is
// the result: Unavailable or DeadlineExceeded, from the transport.
absl::Status AgreeOnStatus(Transport& transport, const absl::Status& mine, int64_t row_bytes = -1,
                           NameRank name = NameRank::kYes);

// The row-count verdict, every backend's (Transport::CheckRowCounts, and
// the checked all-to-alls of the c10d and NCCL backends): each rank reports
// what it found in kVerdictFields int64s, which travel in whatever
// collective the backend has, and JudgeVerdicts turns everyone's reports
// into the one status all ranks return.
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

// A verdict as the bytes of an AllGatherBytes (or a hub round), and
// JudgeVerdicts of every rank's such bytes (by rank): Malformed for bytes
// that are not one verdict.
std::string VerdictBytes(const std::vector<int64_t>& verdict);
absl::Status JudgeVerdictBytes(const std::vector<std::string>& all);

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_AGREEMENT_H_
