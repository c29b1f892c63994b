// The step state machines of PlannerClient: group mode (every rank's
// report all-gathered, rank 0 asks the service and broadcasts its answer),
// per-rank mode (each rank asks, then all agree on every rank's outcome),
// local planning, and plan-ahead. The service link is planner_link.h, what
// the ranks tell each other rank_report.h, when to ask the service at all
// fallback_policy.h, how each kind of answer becomes a StepPlan step_plan.h.

#include "client/planner_client.h"

#include <chrono>
#include <deque>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/fallback_policy.h"
#include "client/planner_credentials.h"
#include "client/planner_link.h"
#include "client/planner_target.h"
#include "client/rank_report.h"
#include "client/rank_speed_source.h"
#include "client/step_plan.h"
#include "client/step_requests.h"
#include "common/log.h"
#include "planner/attention_mask.h"
#include "planner/plan_fingerprint.h"
#include "proto/plan_proto.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

using client::RankReport;
using client::StepOutcome;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// This rank's verdict on its own input: the caller's refusal, else its
// masks, checked before they become messages (so that an unknown kind
// cannot pass as full).
absl::Status RefusedInput(const std::vector<int64_t>& lengths,
                          const std::vector<AttentionMask>& masks,
                          const absl::Status& caller_refused) {
  if (!caller_refused.ok()) return caller_refused;
  return CheckMaskList(lengths, masks, "attention_masks");
}

uint64_t DrawIncarnation() {
  std::random_device device;
  uint64_t drawn =
      (uint64_t{device()} << 32) ^ device() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  return drawn == 0 ? 1 : drawn;
}

}  // namespace

const char* PlannerModeName(PlannerMode mode) {
  return mode == PlannerMode::kGroup ? "group" : "per-rank";
}

absl::StatusOr<PlannerMode> ParsePlannerMode(const std::string& name) {
  if (name == "group") return PlannerMode::kGroup;
  if (name == "per-rank") return PlannerMode::kPerRank;
  return absl::InvalidArgumentError(
      absl::StrCat("planner mode: '", name, "' is neither 'group' nor 'per-rank'"));
}

// A step requested ahead (Prefetch), until its Plan.
struct Prefetched {
  v1::StepSpec spec;
  std::vector<int64_t> lengths;
  std::vector<AttentionMask> masks;
  // Group mode: what the all-gather brought.
  std::optional<Gathered> gathered;
  // The service's answer, while `call` runs (per-rank mode: this rank's
  // slice; group mode, rank 0: the chunk table).
  v1::PlanRequest request;
  v1::PlanResponse response;
  v1::PlanGroupResponse group_response;
  std::unique_ptr<BackgroundCall> call;  // last: cancelled before the rest goes
};

struct PlannerClient::Rep {
  Rep(PlannerClientOptions options_in, Transport* transport_in)
      : options(std::move(options_in)),
        transport(transport_in),
        has_service(!options.address.empty()),
        policy(options.address, transport->rank(), options.mode == PlannerMode::kGroup) {}

  const PlannerClientOptions options;
  Transport* const transport;
  const bool has_service;  // an address is configured
  // Null without a service, and in group mode on every rank but 0.
  std::unique_ptr<PlannerLink> link;
  FallbackPolicy policy;
  // Of the current Plan call, the time spent blocked on the service's answer.
  double service_wait_seconds = 0;
  uint64_t incarnation = 0;
  std::unique_ptr<Prefetched> pending;
  // Why the online gamma fit is not used, as last logged (a fit that never
  // comes is otherwise silent).
  std::optional<std::string> logged_gamma_note;
  GroupRequests group_requests;  // rank 0 in group mode; every rank when learning speeds
  RankSpeedSource speeds{options, transport->size()};

  bool group_mode() const { return options.mode == PlannerMode::kGroup; }
  bool leader() const { return transport->rank() == 0; }
  // The ranks whose probes decide that the service is back: those that ask it.
  int probing_ranks() const { return group_mode() ? 1 : transport->size(); }
  bool probe_answered() const {
    return policy.service_down() && link != nullptr && link->probe_answered();
  }

  void LogGammaNote(const v1::StepSpec& spec, const std::string& note, double gamma) {
    if (!leader() || logged_gamma_note == note) return;
    logged_gamma_note = note;
    // The measured model's fitted part is its attention table.
    const bool table = spec.cost_model() == v1::COST_MODEL_MEASURED;
    const std::string fitted =
        table ? std::string("attention table") : absl::StrCat("gamma ", gamma);
    const std::string given =
        table ? std::string("the spec's attention table") : absl::StrCat("gamma ", gamma);
    Log(note.empty() ? LogLevel::kInfo : LogLevel::kWarning,
        note.empty() ? absl::StrCat("rank 0: step ", spec.step(),
                                    " is planned with the service's fitted ", fitted)
                     : absl::StrCat("rank 0: online ", table ? "table" : "gamma",
                                    " fit not used at step ", spec.step(), ": ", note,
                                    "; planning with ", given));
  }

  // Per-rank mode: every rank draws one and all take rank 0's (one small
  // all-gather, in this rank's report of `call` at `spec`). Group mode: only
  // rank 0 sends requests, so its own draw is the run's. Never 0 (which
  // means none).
  absl::Status EnsureIncarnation(RankReport::Call call, const v1::StepSpec& spec) {
    if (incarnation != 0) return absl::OkStatus();
    const uint64_t mine = options.incarnation != 0 ? options.incarnation : DrawIncarnation();
    if (group_mode()) {
      incarnation = mine;
      return absl::OkStatus();
    }
    RankReport report = InStep(call, spec);
    report.set_incarnation(mine);
    absl::StatusOr<std::vector<RankReport>> all = GatherInStep(report);
    if (!all.ok()) return all.status();
    if ((*all)[0].incarnation() == 0) return absl::InternalError("rank 0: drew incarnation 0");
    incarnation = (*all)[0].incarnation();
    return absl::OkStatus();
  }

  // Per-rank mode's own all-gathers of a step carry reports of the call
  // this rank is in (InStep), so that a peer in an exchange without a plan
  // (whose report says so) is named on every rank, not misread.
  RankReport InStep(RankReport::Call call, const v1::StepSpec& spec) const {
    RankReport report;
    report.set_call(call);
    *report.mutable_spec() = ComparedSpec(spec);
    return report;
  }
  absl::StatusOr<std::vector<RankReport>> GatherInStep(const RankReport& mine) {
    absl::StatusOr<std::vector<RankReport>> all = AllGatherMessages(*transport, mine);
    if (!all.ok()) return all.status();
    if (absl::Status calls = CheckCalls(*all, /*all_alike=*/false); !calls.ok()) return calls;
    return all;
  }

  // This rank's request of `spec` (per-rank mode).
  v1::PlanRequest MyRequest(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                            const std::vector<AttentionMask>& masks,
                            const v1::StepTiming* previous) const {
    return RankRequest(spec, incarnation, transport->rank(), lengths, masks, previous);
  }

  // The step solved here, from every rank's lengths (every rank computes
  // the identical plan), by the declared or learned speeds.
  absl::StatusOr<StepPlan> SolveHere(const v1::StepSpec& spec, const RankLengths& lengths,
                                     const RankMasks& masks) const {
    if (!speeds.learning()) {
      return SolveStepLocally(spec, lengths, masks, options.balancer, transport->rank());
    }
    BalancerOptions balancer = options.balancer;
    balancer.rank_speeds = speeds.Speeds();
    return SolveStepLocally(spec, lengths, masks, balancer, transport->rank());
  }

  absl::Status CheckWorldSize(const v1::StepSpec& spec) const {
    if (spec.world_size() == transport->size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("spec.world_size: ", spec.world_size(),
                                                   " but the transport has ", transport->size(),
                                                   " ranks"));
  }

  // This rank's report of a Plan or Prefetch call: `refused` is its verdict,
  // else the spec's world size against the transport's.
  RankReport ReportFor(RankReport::Call call, const v1::StepSpec& spec,
                       const std::vector<int64_t>& lengths, const std::vector<AttentionMask>& masks,
                       const v1::StepTiming* previous,
                       const absl::Status& refused = absl::OkStatus()) const {
    const absl::Status verdict = !refused.ok() ? refused : CheckWorldSize(spec);
    return ReportOf(call, spec, lengths, masks, previous, verdict, probe_answered());
  }

  absl::StatusOr<Gathered> Gather(const RankReport& mine) {
    return GatherReports(*transport, mine, probing_ranks());
  }

  // When the service is down and every probing rank's probe was answered,
  // it is back up from the next step on (once the relapse hold is over), on
  // every rank alike.
  void MaybeBackUp(const v1::StepSpec& spec, bool probes_answered) {
    if (policy.MaybeBackUp(spec.step(), probes_answered) && link != nullptr) link->StopProbing();
  }

  // After a step the service failed: local planning, probes, a longer hold
  // after a relapse. Decided from shared outcomes: the same on every rank.
  void MarkDown(const v1::StepSpec& spec, const std::string& why) {
    policy.LogSource(
        PlanSource::kLocal, spec.step(),
        absl::StrCat(why, "; not asking it again until ",
                     group_mode() ? "rank 0's" : "every rank's", " probe is answered"));
    policy.MarkDown(spec.step(), why);
    if (link != nullptr) link->StartProbing(spec.job_id());
  }

  // Whether the channel is plaintext: Create makes planner_tls's
  // credentials, so no credentials is neither TLS nor the caller's own.
  bool Plaintext() const { return options.credentials == nullptr; }

  // Why a step fell back: `who` could not get it from the service, which
  // said `unreachable`. A job token over a plaintext channel adds the
  // likeliest cause: a planner that serves TLS closes a plaintext
  // connection, which gRPC reports only as "Socket closed".
  std::string FellBack(const std::string& who, const StepOutcome& unreachable) const {
    std::string why = absl::StrCat(who, " from ", options.address, ": ",
                                   unreachable.status().message());
    if (unreachable.status().code() == static_cast<int>(absl::StatusCode::kUnavailable) &&
        !options.token.empty() && Plaintext() && !options.mesh_tls) {
      absl::StrAppend(&why,
                      " (a job token is set and the channel is plaintext: if the planner serves "
                      "TLS, give its CA as planner_tls={\"ca\": ...}, KNAPFORMER_PLANNER_TLS_CA "
                      "or PlannerClientOptions::tls)");
    }
    return why;
  }

  // After `who` (a rank) had the job's credentials refused by the service
  // (`refused`: UNAUTHENTICATED or PERMISSION_DENIED), the same on every
  // rank: a configuration error, not an outage. Under require_service that
  // code on every rank; else OK, and the ranks plan locally for the rest of
  // the run without asking or probing the service again.
  absl::Status AfterCredentialsRefused(const v1::StepSpec& spec, const StepOutcome& refused,
                                       const std::string& who) {
    const std::string why = absl::StrCat(
        who, "the planner service at ", options.address, " refused the job's credentials (",
        absl::StatusCodeToString(static_cast<absl::StatusCode>(refused.status().code())), ": ",
        refused.status().message(), "; sent job id '", spec.job_id(), "' with ",
        options.token.empty() ? "no job token" : "a job token",
        options.tls.enabled() ? " over TLS"
        : Plaintext()         ? " in plaintext"
                              : " over the caller's channel credentials",
        "): check the token (knapformer token) and the job id it was made for");
    if (options.require_service) {
      return absl::Status(static_cast<absl::StatusCode>(refused.status().code()),
                          absl::StrCat("step ", spec.step(), ": ", why,
                                       "; require_planner is set, so no rank plans it locally"));
    }
    policy.MarkRefused(spec.step(), why);
    return absl::OkStatus();
  }

  // The error of a step the service did not plan, under require_service:
  // the same on every rank (decided from shared outcomes).
  absl::Status Required(const v1::StepSpec& spec, const std::string& why) const {
    return absl::UnavailableError(absl::StrCat(
        "step ", spec.step(), ": the planner service at ", options.address, " did not plan it (",
        why, ") and require_planner is set, so no rank plans it locally"));
  }

  // Every rank's lengths in one all-gather (with its probe's result and its
  // verdict on a prefetch), then the local solve.
  absl::StatusOr<StepPlan> PlanLocally(const v1::StepSpec& spec,
                                       const std::vector<int64_t>& lengths,
                                       const std::vector<AttentionMask>& masks,
                                       const std::string& mismatch,
                                       const absl::Status& refused = absl::OkStatus()) {
    const absl::Status verdict =
        !refused.ok() || mismatch.empty() ? refused : absl::FailedPreconditionError(mismatch);
    absl::StatusOr<Gathered> gathered =
        Gather(ReportFor(RankReport::PLAN, spec, lengths, masks, nullptr, verdict));
    if (!gathered.ok()) return gathered.status();
    MaybeBackUp(spec, gathered->probes_answered);
    return SolveHere(spec, gathered->lengths, gathered->masks);
  }

  // A step planned locally because the service refused it for a conflict
  // (`detail` says which), logged on every rank.
  absl::StatusOr<StepPlan> AfterConflict(const v1::StepSpec& spec, absl::StatusOr<StepPlan> local,
                                         const std::string& detail) {
    if (local.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("rank ", transport->rank(), ": step ", spec.step(),
                                           " planned locally: the planner service at ",
                                           options.address, " refused it for a conflict", detail));
    }
    return local;
  }

  absl::StatusOr<StepPlan> PlanPerRank(const v1::StepSpec& spec,
                                       const std::vector<int64_t>& lengths,
                                       const std::vector<AttentionMask>& masks,
                                       const absl::Status& refused, const v1::StepTiming* previous,
                                       std::unique_ptr<Prefetched> prefetched);
  absl::StatusOr<StepPlan> PlanGroup(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                                     const std::vector<AttentionMask>& masks,
                                     const absl::Status& refused, const v1::StepTiming* previous,
                                     std::unique_ptr<Prefetched> prefetched);
  // Group mode: the step's plan from rank 0's broadcast answer, or planned
  // locally when the service failed it.
  absl::StatusOr<StepPlan> FinishGroup(const v1::StepSpec& spec, const Gathered& gathered,
                                       Prefetched* prefetched);
};

absl::StatusOr<StepPlan> PlannerClient::Rep::PlanPerRank(const v1::StepSpec& spec,
                                                         const std::vector<int64_t>& lengths,
                                                         const std::vector<AttentionMask>& masks,
                                                         const absl::Status& refused,
                                                         const v1::StepTiming* previous,
                                                         std::unique_ptr<Prefetched> prefetched) {
  const std::string mismatch = prefetched != nullptr
                                   ? PrefetchMismatch(prefetched->spec, prefetched->lengths,
                                                      prefetched->masks, spec, lengths, masks)
                                   : "";
  if (!has_service) {
    policy.LogSource(PlanSource::kLocal, spec.step(), "no planner service configured");
    return PlanLocally(spec, lengths, masks, mismatch, refused);
  }
  if (absl::Status agreed = EnsureIncarnation(RankReport::PLAN, spec); !agreed.ok()) {
    return agreed;
  }
  if (policy.service_down()) return PlanLocally(spec, lengths, masks, mismatch, refused);

  // A rank whose step differs from its prefetch still completes the
  // service's rendezvous (with what it prefetched), so that no peer waits
  // for it; then every rank learns of the mismatch below.
  v1::PlanRequest request;
  v1::PlanResponse response;
  grpc::Status status;
  const auto asked = std::chrono::steady_clock::now();
  if (prefetched != nullptr && prefetched->call != nullptr) {
    status = prefetched->call->Wait();
    request = std::move(prefetched->request);
    response = std::move(prefetched->response);
  } else if (!refused.ok()) {
    // The rank still asks, with a length the service refuses, as a rank
    // with a bad length does: the service withdraws the step, so its peers
    // waiting in the rendezvous are answered at once (ABORTED) instead of
    // at its timeout; then every rank learns of the refusal below.
    request = MyRequest(spec, {-1}, {}, previous);
    link->Plan(request, &response);
  } else {
    request = MyRequest(spec, lengths, masks, previous);
    status = link->Plan(request, &response);
  }
  service_wait_seconds = SecondsSince(asked);
  // This rank's refused input is its verdict, whatever the service said
  // (also of a prefetched call, sent before the refusal was known).
  if (!refused.ok()) {
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(refused.message()));
  }
  // A plan that is not even well-formed (columns of different lengths) is
  // the service failing, like an error: every rank falls back together.
  absl::StatusOr<RankPlan> plan = absl::UnknownError("no plan");
  if (status.ok()) {
    plan = RankPlanFromProto(response.plan(), spec.world_size());
    if (!plan.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            std::string("the service's answer is malformed: ") +
                                std::string(plan.status().message()));
    } else if (request.attention_masks_size() > 0 && !response.balance().attention_masks()) {
      // A service from before masks ignores them: its plan is mask-blind,
      // and the trainer would not learn the masks it holds.
      status = grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "the service ignored the attention masks (it predates them)");
    }
  }
  // Every rank learns every rank's outcome (and its workloads under the
  // plan it got) in one exchange.
  StepOutcome mine = OutcomeOf(status.error_code(), status.error_message());
  if (!mismatch.empty()) {
    mine.set_outcome(StepOutcome::MISMATCH);
    *mine.mutable_status() = VerdictOf(absl::FailedPreconditionError(mismatch));
  } else if (mine.outcome() == StepOutcome::GOT_PLAN) {
    mine.set_workload_before(response.plan().workload_before());
    mine.set_workload_after(response.plan().workload_after());
    *mine.mutable_fingerprint() = FingerprintToProto(FingerprintOf(*plan, masks));
  }
  RankReport report = InStep(RankReport::PLAN, spec);
  *report.mutable_outcome() = std::move(mine);
  absl::StatusOr<std::vector<RankReport>> reports = GatherInStep(report);
  if (!reports.ok()) return reports.status();
  std::vector<StepOutcome> outcomes;
  for (RankReport& theirs : *reports) outcomes.push_back(std::move(*theirs.mutable_outcome()));
  const std::vector<StepOutcome>* all = &outcomes;

  int32_t first_fallback = -1, first_conflict = -1, first_refused = -1;
  for (size_t r = 0; r < all->size(); ++r) {
    const StepOutcome& theirs = (*all)[r];
    if (absl::Status checked = CheckOutcome(theirs, static_cast<int>(r)); !checked.ok()) {
      return checked;
    }
    if (theirs.outcome() == StepOutcome::REFUSED_INPUT) {
      return OutcomeStatus(theirs,
                           absl::StrCat("rank ", r, "'s request was refused by the planner: "));
    }
    if (theirs.outcome() == StepOutcome::MISMATCH) {
      return OutcomeStatus(theirs, absl::StrCat("rank ", r, ": "));
    }
    const int32_t rank = static_cast<int32_t>(r);
    if (theirs.outcome() == StepOutcome::FALL_BACK && first_fallback < 0) first_fallback = rank;
    if (theirs.outcome() == StepOutcome::CONFLICT && first_conflict < 0) first_conflict = rank;
    if (theirs.outcome() == StepOutcome::REFUSED_CREDENTIALS && first_refused < 0) {
      first_refused = rank;
    }
  }
  if (first_refused >= 0) {
    absl::Status failed = AfterCredentialsRefused(spec, (*all)[first_refused],
                                                  absl::StrCat("rank ", first_refused, ": "));
    if (!failed.ok()) return failed;
    return PlanLocally(spec, lengths, masks, "");
  }
  if (first_fallback < 0 && first_conflict >= 0) {
    // Planning locally compares every rank's spec: if this run's own ranks
    // disagree, that is its error (FailedPrecondition naming the rank);
    // otherwise the conflict came from outside the run, and must neither
    // fail nor stall it. The service stays in use for the next step.
    const std::string& said = (*all)[first_conflict].status().message();
    const std::string why = absl::StrCat("rank ", first_conflict, ": ", said);
    if (options.require_service) return Required(spec, why);
    policy.set_local_reason(why);
    return AfterConflict(
        spec, PlanLocally(spec, lengths, masks, ""),
        absl::StrCat(" this run's ranks do not have (", why, "); another client sends job id '",
                     spec.job_id(), "' with incarnation ", absl::Hex(request.spec().incarnation()),
                     " (set by the caller, or copied from this run)"));
  }
  if (first_fallback >= 0) {
    const std::string why = FellBack(
        absl::StrCat("rank ", first_fallback, " could not get its plan"), (*all)[first_fallback]);
    if (options.require_service) return Required(spec, why);
    MarkDown(spec, why);
    return PlanLocally(spec, lengths, masks, "");
  }
  // Every share is well formed on its own rank; the shares must also agree
  // with each other, or the exchanges would mix sequences. Decided from the
  // same outcomes on every rank.
  std::vector<PlanFingerprint> fingerprints;
  for (const StepOutcome& theirs : *all) {
    fingerprints.push_back(FingerprintFromProto(theirs.fingerprint()));
  }
  if (absl::Status agree = CheckFingerprints(fingerprints); !agree.ok()) {
    const std::string why = absl::StrCat("the planner service at ", options.address,
                                         " answered step ", spec.step(), " with plans that ",
                                         agree.message());
    if (options.require_service) return Required(spec, why);
    policy.set_local_reason(why);
    Log(LogLevel::kWarning, absl::StrCat("rank ", transport->rank(), ": step ", spec.step(),
                                         " planned locally: ", why));
    return PlanLocally(spec, lengths, masks, "");
  }
  policy.LogSource(PlanSource::kService, spec.step(), options.address);
  return StepPlanOfRankAnswer(response, *std::move(plan), *all);
}

absl::StatusOr<StepPlan> PlannerClient::Rep::PlanGroup(const v1::StepSpec& spec,
                                                       const std::vector<int64_t>& lengths,
                                                       const std::vector<AttentionMask>& masks,
                                                       const absl::Status& refused,
                                                       const v1::StepTiming* previous,
                                                       std::unique_ptr<Prefetched> prefetched) {
  Gathered gathered;
  if (prefetched != nullptr) {
    // The lengths went out with the prefetch: only the ranks' verdicts now.
    const std::string mismatch = PrefetchMismatch(prefetched->spec, prefetched->lengths,
                                                  prefetched->masks, spec, lengths, masks);
    RankReport mine;
    mine.set_call(RankReport::PREFETCHED);
    *mine.mutable_verdict() = VerdictOf(
        !refused.ok() || mismatch.empty() ? refused : absl::FailedPreconditionError(mismatch));
    absl::StatusOr<Gathered> agreed = Gather(mine);
    if (!agreed.ok()) return agreed.status();
    gathered = *std::move(prefetched->gathered);
  } else {
    absl::StatusOr<Gathered> all =
        Gather(ReportFor(RankReport::PLAN, spec, lengths, masks, previous, refused));
    if (!all.ok()) return all.status();
    gathered = *std::move(all);
  }
  speeds.Learn(spec, gathered, group_requests);
  const bool learning = speeds.learning();
  if (!has_service) {
    policy.LogSource(PlanSource::kLocal, spec.step(), "no planner service configured");
    absl::StatusOr<StepPlan> local = SolveHere(spec, gathered.lengths, gathered.masks);
    if (local.ok()) group_requests.KeepWork(spec, gathered, *local, learning, learning);
    return local;
  }
  absl::StatusOr<StepPlan> result;
  if (policy.service_down()) {
    MaybeBackUp(spec, gathered.probes_answered);
    result = SolveHere(spec, gathered.lengths, gathered.masks);
  } else {
    result = FinishGroup(spec, gathered, prefetched.get());
  }
  if (result.ok()) group_requests.KeepWork(spec, gathered, *result, leader() || learning, learning);
  return result;
}

absl::StatusOr<StepPlan> PlannerClient::Rep::FinishGroup(const v1::StepSpec& spec,
                                                         const Gathered& gathered,
                                                         Prefetched* prefetched) {
  // Rank 0's outcome, with the service's answer when it got one.
  StepOutcome answer;
  if (leader()) {
    grpc::Status status;
    v1::PlanGroupResponse asked_now;
    v1::PlanGroupResponse* response = &asked_now;
    const auto asked = std::chrono::steady_clock::now();
    if (prefetched != nullptr && prefetched->call != nullptr) {
      status = prefetched->call->Wait();
      response = &prefetched->group_response;
    } else if (absl::Status drawn = EnsureIncarnation(RankReport::PLAN, spec); !drawn.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(drawn.message()));
    } else {
      status = link->PlanGroup(group_requests.Request(spec, incarnation, gathered, speeds.Speeds()),
                               &asked_now);
    }
    service_wait_seconds = SecondsSince(asked);
    answer = OutcomeOf(status.error_code(), status.error_message());
    if (answer.outcome() == StepOutcome::GOT_PLAN)
      *answer.mutable_response() = std::move(*response);
  }
  absl::StatusOr<StepOutcome> got = BroadcastMessage(*transport, 0, answer);
  if (!got.ok()) return got.status();
  if (absl::Status checked = CheckOutcome(*got, 0); !checked.ok()) return checked;
  const std::string& said = got->status().message();
  if (got->outcome() == StepOutcome::REFUSED_INPUT) {
    return OutcomeStatus(*got, "rank 0's request was refused by the planner: ");
  }
  if (got->outcome() == StepOutcome::MISMATCH) {
    return absl::InternalError("rank 0 reported a prefetch mismatch in group mode");
  }
  if (got->outcome() == StepOutcome::REFUSED_CREDENTIALS) {
    if (absl::Status failed = AfterCredentialsRefused(spec, *got, "rank 0: "); !failed.ok()) {
      return failed;
    }
    return SolveHere(spec, gathered.lengths, gathered.masks);
  }
  if (got->outcome() == StepOutcome::CONFLICT) {
    if (options.require_service) return Required(spec, said);
    policy.set_local_reason(absl::StrCat("refused for a conflict: ", said));
    return AfterConflict(spec, SolveHere(spec, gathered.lengths, gathered.masks),
                         absl::StrCat(" (", said, ")"));
  }
  std::string why;
  if (got->outcome() == StepOutcome::GOT_PLAN) {
    // Every rank checks the same answer against the same lengths: all take
    // the service's plan, or all find it malformed and fall back.
    absl::StatusOr<StepPlan> from_service =
        StepPlanOfGroupAnswer(spec, gathered, got->response(), transport->rank());
    if (from_service.ok()) {
      policy.LogSource(PlanSource::kService, spec.step(), options.address);
      return from_service;
    }
    why = absl::StrCat("rank 0's answer from ", options.address,
                       " is malformed: ", from_service.status().message());
  } else {
    why = FellBack("rank 0 could not get the plan", *got);
  }
  if (options.require_service) return Required(spec, why);
  MarkDown(spec, why);
  return SolveHere(spec, gathered.lengths, gathered.masks);
}

PlannerClient::PlannerClient(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
PlannerClient::~PlannerClient() = default;

uint64_t PlannerClient::incarnation() const { return rep_->incarnation; }

absl::StatusOr<std::unique_ptr<PlannerClient>> PlannerClient::Create(PlannerClientOptions options,
                                                                     Transport* transport) {
  if (transport == nullptr) return absl::InvalidArgumentError("transport: must not be null");
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be at least 1, got ", options.max_attempts));
  }
  if (options.max_answer_bytes < 1024 || options.max_answer_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_answer_bytes: must be in 1024..", INT32_MAX, ", got ", options.max_answer_bytes));
  }
  for (const auto& [name, value] : {std::make_pair("call_deadline", options.call_deadline),
                                    std::make_pair("probe_interval", options.probe_interval),
                                    std::make_pair("probe_deadline", options.probe_deadline)}) {
    if (!(value > absl::ZeroDuration())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be > 0, got ", absl::FormatDuration(value)));
    }
  }
  const bool has_service = !options.address.empty();
  if (has_service) {
    if (absl::Status valid = CheckPlannerTarget(options.address); !valid.ok()) return valid;
  }
  if (absl::Status valid = CheckPlannerToken(options.token); !valid.ok()) return valid;
  if (!options.token.empty() && has_service && options.credentials == nullptr &&
      !options.tls.enabled() && !options.mesh_tls && !PlannerTargetIsLocal(options.address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "planner_token: the token would cross the network in clear to '", options.address,
        "' (no TLS): set planner_tls (the CA of the planner's certificate; "
        "KNAPFORMER_PLANNER_TLS_CA), or planner_mesh_tls=True where a service mesh encrypts "
        "the connection (KNAPFORMER_PLANNER_MESH_TLS=1); loopback and unix: addresses need "
        "neither"));
  }
  // Every rank reads the TLS files (not only the one that connects), so
  // that a missing file is every rank's error when the client is made.
  if (options.credentials == nullptr && options.tls.enabled()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        PlannerChannelCredentials(options.tls);
    if (!credentials.ok()) return credentials.status();
    options.credentials = *std::move(credentials);
  }
  if (options.require_service && !has_service) {
    return absl::InvalidArgumentError(
        "require_planner: set, but no planner address is (planner_address= or "
        "KNAPFORMER_PLANNER_ADDRESS): there is no service to require");
  }
  if (has_service && options.mode == PlannerMode::kPerRank) {
    if (const int replicas = PlannerTargetReplicas(options.address); replicas > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "planner_address: '", options.address, "' names ", replicas,
          " planner replicas, but per-rank mode needs every rank of a step to reach the same "
          "one (the ranks meet in its memory); use group mode (the default, which any replica "
          "answers) or one replica's address"));
    }
  }
  if (absl::Status speeds = RankSpeedSource::Check(options, transport->size()); !speeds.ok()) {
    return speeds;
  }
  auto rep = std::make_unique<Rep>(std::move(options), transport);
  // In group mode only rank 0 talks to the service.
  if (has_service && (!rep->group_mode() || rep->leader())) {
    const PlannerClientOptions& o = rep->options;
    PlannerLinkOptions link;  // by name: two durations swapped would still compile
    link.address = o.address;
    link.credentials = o.credentials;
    link.token = o.token;
    link.spread_over_replicas = rep->group_mode();
    link.call_deadline = o.call_deadline;
    link.max_attempts = o.max_attempts;
    link.initial_backoff = o.initial_backoff;
    link.max_backoff = o.max_backoff;
    link.probe_interval = o.probe_interval;
    link.probe_deadline = o.probe_deadline;
    link.max_answer_bytes = o.max_answer_bytes;
    rep->link = std::make_unique<PlannerLink>(std::move(link));
  }
  return std::unique_ptr<PlannerClient>(new PlannerClient(std::move(rep)));
}

absl::StatusOr<StepPlan> PlannerClient::Plan(const v1::StepSpec& spec,
                                             const std::vector<int64_t>& lengths,
                                             const v1::StepTiming* previous,
                                             const std::vector<AttentionMask>& masks,
                                             const absl::Status& caller_refused) {
  Rep& rep = *rep_;
  const absl::Status refused = RefusedInput(lengths, masks, caller_refused);
  const auto start = std::chrono::steady_clock::now();
  rep.service_wait_seconds = 0;
  if (absl::Status sized = rep.CheckWorldSize(spec); !sized.ok()) return sized;
  // A prefetch of a later step waits for its step; one of an earlier step
  // (skipped) is dropped, which cancels its call.
  std::unique_ptr<Prefetched> prefetched;
  if (rep.pending != nullptr && rep.pending->spec.step() == spec.step()) {
    prefetched = std::move(rep.pending);
  } else if (rep.pending != nullptr && rep.pending->spec.step() < spec.step()) {
    rep.pending.reset();
  }
  const bool was_prefetched = prefetched != nullptr;
  absl::StatusOr<StepPlan> result =
      rep.group_mode()
          ? rep.PlanGroup(spec, lengths, masks, refused, previous, std::move(prefetched))
          : rep.PlanPerRank(spec, lengths, masks, refused, previous, std::move(prefetched));
  if (result.ok()) {
    result->prefetched = was_prefetched;
    result->wait_seconds = SecondsSince(start);
    result->service_wait_seconds = rep.service_wait_seconds;
    if (rep.has_service && result->source == PlanSource::kLocal) {
      rep.policy.CountLocalStep(spec.step());
    }
    if (spec.use_fitted_gamma()) {
      if (result->source == PlanSource::kLocal) {
        result->gamma_note = rep.has_service
                                 ? "planned locally: the fitted gamma lives in the service"
                                 : "no planner service: the fit is the service's";
      }
      rep.LogGammaNote(spec, result->gamma_note,
                       result->gamma_used > 0 ? result->gamma_used : spec.gamma());
    }
    result->local_steps = rep.policy.local_steps();
    result->local_reason = rep.policy.local_steps() > 0 ? rep.policy.local_reason() : "";
    if (rep.options.log_steps && rep.leader()) Log(LogLevel::kInfo, StepLine(spec.step(), *result));
  }
  return result;
}

absl::Status PlannerClient::Prefetch(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                                     const v1::StepTiming* previous,
                                     const std::vector<AttentionMask>& masks,
                                     const absl::Status& caller_refused) {
  Rep& rep = *rep_;
  const absl::Status refused = RefusedInput(lengths, masks, caller_refused);
  rep.pending.reset();  // replaces an unused one, cancelling its call
  auto prefetched = std::make_unique<Prefetched>();
  prefetched->spec = spec;
  prefetched->lengths = lengths;
  prefetched->masks = masks;
  Prefetched* const p = prefetched.get();
  PlannerLink* const link = rep.link.get();
  if (rep.group_mode()) {
    absl::StatusOr<Gathered> gathered =
        rep.Gather(rep.ReportFor(RankReport::PREFETCH, spec, lengths, masks, previous, refused));
    if (!gathered.ok()) return gathered.status();
    prefetched->gathered = *std::move(gathered);
    if (link != nullptr && !rep.policy.service_down()) {
      if (absl::Status drawn = rep.EnsureIncarnation(RankReport::PREFETCH, spec); !drawn.ok()) {
        return drawn;
      }
      auto request = std::make_shared<const v1::PlanGroupRequest>(
          rep.group_requests.Request(spec, rep.incarnation, *p->gathered, rep.speeds.Speeds()));
      prefetched->call = std::make_unique<BackgroundCall>([link, p, request](CancelToken* token) {
        return link->PlanGroup(*request, &p->group_response, token);
      });
    }
  } else {
    if (absl::Status sized = rep.CheckWorldSize(spec); !sized.ok()) return sized;
    if (rep.has_service) {
      if (absl::Status agreed = rep.EnsureIncarnation(RankReport::PREFETCH, spec); !agreed.ok()) {
        return agreed;
      }
    }
    if (link != nullptr && !rep.policy.service_down()) {
      // A refused input asks with a length the service refuses (which
      // withdraws the step: no peer waits for it); the step's Plan reports
      // the refusal on every rank.
      prefetched->request = refused.ok() ? rep.MyRequest(spec, lengths, masks, previous)
                                         : rep.MyRequest(spec, {-1}, {}, previous);
      prefetched->call = std::make_unique<BackgroundCall>(
          [link, p](CancelToken* token) { return link->Plan(p->request, &p->response, token); });
    }
  }
  rep.pending = std::move(prefetched);
  return absl::OkStatus();
}

}  // namespace knapformer
