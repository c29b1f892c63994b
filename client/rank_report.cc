#include "client/rank_report.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/mask_proto.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

// The first field in which two specs differ, with both values ("d_model: 8
// on rank 0, 16 on rank 3"); every field is compared on its own, so the
// text names the field whatever its kind.
std::string SpecDifference(const v1::StepSpec& a, int rank_a, const v1::StepSpec& b, int rank_b) {
  const google::protobuf::Descriptor* descriptor = a.GetDescriptor();
  const google::protobuf::Reflection* reflection = a.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    v1::StepSpec only_a = a, only_b = b;
    for (int j = 0; j < descriptor->field_count(); ++j) {
      if (j == i) continue;
      reflection->ClearField(&only_a, descriptor->field(j));
      reflection->ClearField(&only_b, descriptor->field(j));
    }
    if (only_a.SerializeAsString() == only_b.SerializeAsString()) continue;
    auto value = [&](const v1::StepSpec& only) {
      const std::string text = only.ShortDebugString();
      return text.empty() ? std::string("unset") : text;
    };
    return absl::StrCat(field->name(), ": ", value(only_a), " on rank ", rank_a, ", ",
                        value(only_b), " on rank ", rank_b);
  }
  return "a field this build does not know";
}

using client::RankReport;
using client::StepOutcome;

// Every rank's masks from the reports: empty when none gave any. Each rank
// checked its own (PlannerClient::Plan), and the step is checked once where
// it is solved (BalancerInput); whether all gave them is decided here, from
// the same messages on every rank.
absl::StatusOr<RankMasks> GatheredMasks(const std::vector<RankReport>& reports) {
  return DecodeRankMasks(
      static_cast<int32_t>(reports.size()),
      [&](int32_t r) -> const ProtoLengths& { return reports[r].lengths().sequence_lengths(); },
      [&](int32_t r) -> const ProtoMasks& { return reports[r].lengths().attention_masks(); },
      [](int32_t r) { return absl::StrCat("rank ", r, ": attention_masks"); });
}

}  // namespace

const char* CallName(RankReport::Call call) {
  switch (call) {
    case RankReport::PLAN:
      return "Plan";
    case RankReport::PREFETCH:
      return "Prefetch";
    case RankReport::UNPLANNED_EXCHANGE:
      return "an exchange (route, reverse_route, pre_attn or post_attn) without a plan";
    default:
      return "Plan of a prefetched step";
  }
}

v1::StepSpec ComparedSpec(const v1::StepSpec& spec) {
  v1::StepSpec compared = spec;
  compared.clear_token_bytes();
  return compared;
}

RankReport ReportOf(RankReport::Call call, const v1::StepSpec& spec,
                    const std::vector<int64_t>& lengths, const std::vector<AttentionMask>& masks,
                    const v1::StepTiming* previous, const absl::Status& verdict,
                    bool probe_answered) {
  RankReport report;
  report.set_call(call);
  report.set_probe_answered(probe_answered);
  *report.mutable_verdict() = VerdictOf(verdict);
  *report.mutable_spec() = ComparedSpec(spec);
  v1::RankLengths* mine = report.mutable_lengths();
  mine->mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
  if (verdict.ok()) {
    for (const AttentionMask& mask : masks) MaskToProto(mask, mine->add_attention_masks());
  }
  if (previous != nullptr && previous->compute_seconds() > 0) {
    report.mutable_timing()->set_step(previous->step());
    report.mutable_timing()->set_compute_seconds(previous->compute_seconds());
  }
  return report;
}

absl::Status CheckCalls(const std::vector<RankReport>& reports, bool all_alike) {
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!RankReport::Call_IsValid(reports[r].call()) ||
        reports[r].call() == RankReport::CALL_UNSPECIFIED) {
      return absl::InternalError(
          absl::StrCat("rank ", r, " is in an unknown call (", reports[r].call(), ")"));
    }
  }
  for (size_t r = 1; r < reports.size(); ++r) {
    const bool unplanned = reports[r].call() == RankReport::UNPLANNED_EXCHANGE ||
                           reports[0].call() == RankReport::UNPLANNED_EXCHANGE;
    if (reports[r].call() != reports[0].call() && (all_alike || unplanned)) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " is in ", CallName(reports[r].call()), " while rank 0 is in ",
                       CallName(reports[0].call()),
                       unplanned ? "; every rank must call PlanRouting (plan_routing in "
                                   "Python) before the step's exchanges"
                                 : "; every rank must prefetch a step, or none"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Gathered> Digest(std::vector<RankReport> reports, int probing_ranks) {
  if (absl::Status calls = CheckCalls(reports, /*all_alike=*/true); !calls.ok()) return calls;
  std::vector<agreement::Verdict> verdicts;
  verdicts.reserve(reports.size());
  for (const RankReport& report : reports) verdicts.push_back(report.verdict());
  if (absl::Status failed = FirstFailure(verdicts); !failed.ok()) return failed;
  Gathered gathered;
  absl::StatusOr<RankMasks> masks = GatheredMasks(reports);
  if (!masks.ok()) return masks.status();
  gathered.masks = *std::move(masks);
  gathered.lengths.resize(reports.size());
  gathered.timings.resize(reports.size());
  gathered.probes_answered = true;
  const std::string spec = reports.empty() ? "" : reports[0].spec().SerializeAsString();
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].spec().SerializeAsString() != spec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec: rank ", r, "'s step spec differs from rank 0's in ",
          SpecDifference(reports[0].spec(), 0, reports[r].spec(), static_cast<int>(r)),
          "; every rank of a step must send the same spec (job, step, topology, d_model "
          "(token_dim in Python), gamma, cost model, token cap, locality)"));
    }
    if (static_cast<int>(r) < probing_ranks) {
      gathered.probes_answered = gathered.probes_answered && reports[r].probe_answered();
    }
    const auto& lengths = reports[r].lengths().sequence_lengths();
    gathered.lengths[r].assign(lengths.begin(), lengths.end());
    if (reports[r].timing().compute_seconds() > 0) {
      gathered.timings[r].set_step(reports[r].timing().step());
      gathered.timings[r].set_compute_seconds(reports[r].timing().compute_seconds());
      gathered.any_timing = true;
    }
  }
  return gathered;
}

absl::StatusOr<Gathered> GatherReports(Transport& transport, const RankReport& mine,
                                       int probing_ranks) {
  absl::StatusOr<std::vector<RankReport>> all = AllGatherMessages(transport, mine);
  if (!all.ok()) return all.status();
  return Digest(*std::move(all), probing_ranks);
}

StepOutcome::Outcome OutcomeOfCode(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kOk:
      return StepOutcome::GOT_PLAN;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return StepOutcome::REFUSED_CREDENTIALS;
    case absl::StatusCode::kInvalidArgument:
      return StepOutcome::REFUSED_INPUT;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
      return StepOutcome::CONFLICT;
    default:
      return StepOutcome::FALL_BACK;
  }
}

StepOutcome OutcomeOf(int code, const std::string& message) {
  StepOutcome outcome;
  outcome.set_outcome(OutcomeOfCode(code));
  outcome.mutable_status()->set_code(code);
  outcome.mutable_status()->set_message(message);
  return outcome;
}

absl::Status CheckOutcome(const StepOutcome& outcome, int rank) {
  if (!StepOutcome::Outcome_IsValid(outcome.outcome())) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, " reported an unknown outcome (", outcome.outcome(), ")"));
  }
  if (absl::Status code = CheckVerdict(outcome.status(), rank); !code.ok()) return code;
  if ((outcome.outcome() == StepOutcome::GOT_PLAN) != (outcome.status().code() == 0)) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank, " reported outcome ", StepOutcome::Outcome_Name(outcome.outcome()),
        outcome.status().code() == 0 ? " without an error" : " with an error"));
  }
  return absl::OkStatus();
}

client::Fingerprint FingerprintToProto(const PlanFingerprint& fingerprint) {
  client::Fingerprint message;
  message.set_sent(fingerprint.sent);
  message.set_expected(fingerprint.expected);
  message.set_bag_first(fingerprint.bag_first);
  message.set_bag_gpus(fingerprint.bag_gpus);
  message.set_bag(fingerprint.bag);
  return message;
}

PlanFingerprint FingerprintFromProto(const client::Fingerprint& message) {
  return {message.sent(), message.expected(), message.bag_first(), message.bag_gpus(),
          message.bag()};
}

absl::Status OutcomeStatus(const StepOutcome& outcome, const std::string& prefix) {
  return StatusOf(outcome.status(), 0, prefix);
}

std::string PrefetchMismatch(const v1::StepSpec& prefetched_spec,
                             const std::vector<int64_t>& prefetched,
                             const std::vector<AttentionMask>& prefetched_masks,
                             const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                             const std::vector<AttentionMask>& masks) {
  if (ComparedSpec(prefetched_spec).SerializeAsString() != ComparedSpec(spec).SerializeAsString()) {
    return absl::StrCat("step ", spec.step(),
                        ": its spec differs from the one prefetched for it (topology, cost "
                        "model, d_model, token cap or locality changed)");
  }
  if (prefetched == lengths) {
    if (prefetched_masks == masks) return "";
    return absl::StrCat("step ", spec.step(),
                        ": its attention masks differ from those prefetched for it; prefetch "
                        "the masks the step will use");
  }
  size_t i = 0;
  while (i < lengths.size() && i < prefetched.size() && lengths[i] == prefetched[i]) ++i;
  std::string where =
      i < lengths.size() && i < prefetched.size()
          ? absl::StrCat("sequence ", i, " has ", lengths[i], " tokens, ", prefetched[i],
                         " prefetched")
          : absl::StrCat(lengths.size(), " sequences, ", prefetched.size(), " prefetched");
  return absl::StrCat("step ", spec.step(), ": its lengths differ from those prefetched for it (",
                      where, "); prefetch the lengths the step will use");
}

}  // namespace knapformer
