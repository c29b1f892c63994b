#ifndef KNAPFORMER_CLIENT_RANK_REPORT_H_
#define KNAPFORMER_CLIENT_RANK_REPORT_H_

// What the ranks of a PlannerClient group tell each other at a step, and
// what every rank concludes from it (the same on every rank: each decides
// from the same gathered messages). The messages are client/rank_report.proto's;
// they travel through transport/agreement.h.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/rank_report.pb.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"
#include "planner/plan_fingerprint.h"
#include "transport/transport.h"

namespace knapformer {

// "Plan", "Prefetch", "Plan of a prefetched step".
const char* CallName(client::RankReport::Call call);

// `spec` as the ranks compare it: token_bytes only prices the moved tokens
// (the service takes the first rank's), so ranks need not agree on it, and
// a step need not match its prefetch on it.
v1::StepSpec ComparedSpec(const v1::StepSpec& spec);

// This rank's report: `call`, the compared spec, its lengths with their
// masks (when it gives any and `verdict` is Ok), the compute time in
// `previous` (when there is one), `verdict` (Ok, or why the step is refused
// on this rank) and whether its last probe was answered.
client::RankReport ReportOf(client::RankReport::Call call, const v1::StepSpec& spec,
                            const std::vector<int64_t>& lengths,
                            const std::vector<AttentionMask>& masks, const v1::StepTiming* previous,
                            const absl::Status& verdict, bool probe_answered);

// What one all-gather of reports tells every rank: the same on all.
struct Gathered {
  RankLengths lengths;
  RankMasks masks;                      // empty when no rank gave any
  std::vector<v1::StepTiming> timings;  // by rank
  bool any_timing = false;
  bool probes_answered = false;  // every probing rank's last probe was answered
};

// The first rank in another call than rank 0 (FailedPrecondition), or in an
// unknown call (Internal): Digest's first check. Unless `all_alike`, only an
// exchange without a plan differs (per-rank mode's own all-gathers, which
// ranks meet whether or not they prefetched the step).
absl::Status CheckCalls(const std::vector<client::RankReport>& reports, bool all_alike);

// The reports' verdict, decided from the same messages on every rank: the
// first rank in another call than rank 0 (FailedPrecondition), an unknown
// call (Internal), the lowest rank's verdict (its code, "rank R: " and its
// message), masks that do not decode, the first spec that differs from rank
// 0's (FailedPrecondition); else what they carry. `probing_ranks`: how many
// ranks (from 0) probe the service.
absl::StatusOr<Gathered> Digest(std::vector<client::RankReport> reports, int probing_ranks);

// Collective over `transport`: every rank's report, digested.
absl::StatusOr<Gathered> GatherReports(Transport& transport, const client::RankReport& mine,
                                       int probing_ranks);

// How a request to the service that ended with `code` (a gRPC status code,
// numbered as absl's) ends the step.
client::StepOutcome::Outcome OutcomeOfCode(int code);

// `outcome` for a service call that ended with (`code`, `message`).
client::StepOutcome OutcomeOf(int code, const std::string& message);

// Internal naming `rank` unless `outcome` carries a known outcome, and a
// status that is not Ok when the outcome is not GOT_PLAN.
absl::Status CheckOutcome(const client::StepOutcome& outcome, int rank);

// A fingerprint as the outcome carries it, and back.
client::Fingerprint FingerprintToProto(const PlanFingerprint& fingerprint);
PlanFingerprint FingerprintFromProto(const client::Fingerprint& fingerprint);

// The status an outcome reports, with `prefix` before the service's message.
// REQUIRES: CheckOutcome(outcome) passed, and the outcome is not GOT_PLAN.
absl::Status OutcomeStatus(const client::StepOutcome& outcome, const std::string& prefix);

// Why a step cannot use what was prefetched for it; empty if it can.
std::string PrefetchMismatch(const v1::StepSpec& prefetched_spec,
                             const std::vector<int64_t>& prefetched,
                             const std::vector<AttentionMask>& prefetched_masks,
                             const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                             const std::vector<AttentionMask>& masks);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_RANK_REPORT_H_
