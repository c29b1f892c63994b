#include "client/planner_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/planner_target.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balance_stats.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "planner/plan_from_chunks.h"
#include "planner/topology.h"
#include "proto/mask_proto.h"
#include "proto/plan_proto.h"
#include "proto/step_problem.h"

namespace knapformer {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What a rank tells the others after asking the service (per-rank mode), or
// rank 0 tells every rank with its answer (group mode).
enum Outcome : char {
  kGotPlan = 0,
  kFallBack = 1,      // the service is unavailable, slow or overloaded
  kRefusedInput = 2,  // the service refused this rank's input: an error for all
  // The step conflicts with what the service already holds for it: another
  // run or a stray client with this job id opened it first (another spec),
  // or it was answered before (a run resumed from a checkpoint replays its
  // steps). Not this run's fault unless its own ranks disagree, which
  // planning locally checks.
  kConflict = 3,
  // This rank's step differs from what it prefetched: an error for all.
  kMismatch = 4,
};

Outcome Classify(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return kGotPlan;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return kRefusedInput;
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
      return kConflict;
    default:
      return kFallBack;
  }
}

// What each rank all-gathers for local planning, for group mode, and (with
// only `kind` and `error`) to agree on a prefetched step.
struct RankBlob {
  // Which call the rank is in: kPlanCall and kPrefetchCall carry the step;
  // kPrefetchedCall is a Plan that found its step prefetched. Ranks in
  // different calls are an error for all, not a hang in the next
  // collective.
  char kind = 0;
  bool probe_answered = false;  // its background probe was last answered
  char error_code = 0;          // absl::StatusCode of `error`
  std::string error;            // this rank's verdict; empty = fine
  std::string spec;             // serialized StepSpec, token_bytes cleared
  uint64_t timing_step = 0;     // StepTiming to pass on (compute_seconds 0 = none)
  double timing_seconds = 0;
  // Empty without masks, else a serialized v1::RankLengths of the lengths
  // and their masks.
  std::string masks;
  std::vector<int64_t> lengths;
};
constexpr char kPlanCall = 'G';
constexpr char kPrefetchCall = 'F';
constexpr char kPrefetchedCall = 'P';

const char* CallName(char kind) {
  switch (kind) {
    case kPlanCall:
      return "Plan";
    case kPrefetchCall:
      return "Prefetch";
    default:
      return "Plan of a prefetched step";
  }
}

template <typename T>
void Put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

template <typename T>
bool Take(const std::string& in, size_t& at, T* value) {
  if (in.size() - at < sizeof(T)) return false;
  std::memcpy(value, in.data() + at, sizeof(T));
  at += sizeof(T);
  return true;
}

std::string Pack(const RankBlob& blob) {
  std::string out;
  out.reserve(48 + blob.error.size() + blob.spec.size() + blob.masks.size() +
              8 * blob.lengths.size());
  Put(out, blob.kind);
  Put(out, static_cast<char>(blob.probe_answered ? 1 : 0));
  Put(out, blob.error_code);
  Put(out, blob.timing_step);
  Put(out, blob.timing_seconds);
  Put(out, static_cast<uint64_t>(blob.error.size()));
  Put(out, static_cast<uint64_t>(blob.spec.size()));
  Put(out, static_cast<uint64_t>(blob.masks.size()));
  out += blob.error;
  out += blob.spec;
  out += blob.masks;
  out.append(reinterpret_cast<const char*>(blob.lengths.data()),
             sizeof(int64_t) * blob.lengths.size());
  return out;
}

// False if malformed.
bool Unpack(const std::string& in, RankBlob* blob) {
  size_t at = 0;
  char probe = 0;
  uint64_t error_size = 0, spec_size = 0, masks_size = 0;
  if (!Take(in, at, &blob->kind) || !Take(in, at, &probe) || !Take(in, at, &blob->error_code) ||
      !Take(in, at, &blob->timing_step) || !Take(in, at, &blob->timing_seconds) ||
      !Take(in, at, &error_size) || !Take(in, at, &spec_size) || !Take(in, at, &masks_size)) {
    return false;
  }
  blob->probe_answered = probe == 1;
  const size_t rest = in.size() - at;
  if (error_size > rest || spec_size > rest - error_size ||
      masks_size > rest - error_size - spec_size ||
      (rest - error_size - spec_size - masks_size) % sizeof(int64_t) != 0) {
    return false;
  }
  blob->error.assign(in.data() + at, error_size);
  blob->spec.assign(in.data() + at + error_size, spec_size);
  blob->masks.assign(in.data() + at + error_size + spec_size, masks_size);
  at += error_size + spec_size + masks_size;
  blob->lengths.resize((in.size() - at) / sizeof(int64_t));
  if (!blob->lengths.empty()) {
    std::memcpy(blob->lengths.data(), in.data() + at, in.size() - at);
  }
  return true;
}

// What one all-gather of RankBlobs tells every rank: the same on all.
struct Gathered {
  RankLengths lengths;
  RankMasks masks;  // empty when no rank gave any
  std::vector<v1::StepTiming> timings;  // by rank
  bool any_timing = false;
  bool probes_answered = false;  // every probing rank's last probe was answered
};

// Every rank's masks from the blobs: empty when none gave any. Each rank
// checked its own (BlobFor); whether all gave them is decided here, from
// the same bytes on every rank.
absl::StatusOr<RankMasks> GatheredMasks(const std::vector<RankBlob>& blobs) {
  const int32_t ranks = static_cast<int32_t>(blobs.size());
  std::vector<v1::RankLengths> given(ranks);
  bool any = false;
  for (int32_t r = 0; r < ranks; ++r) {
    if (blobs[r].masks.empty()) {
      given[r].mutable_sequence_lengths()->Add(blobs[r].lengths.begin(), blobs[r].lengths.end());
    } else if (!given[r].ParseFromString(blobs[r].masks)) {
      return absl::InternalError(absl::StrCat("rank ", r, " sent malformed masks"));
    } else {
      any = true;
    }
  }
  if (!any) return RankMasks();
  return RankMasksFromProto(
      ranks, [&](int32_t r) -> const ProtoMasks& { return given[r].attention_masks(); },
      [&](int32_t r) -> const ProtoLengths& { return given[r].sequence_lengths(); },
      [](int32_t r) { return absl::StrCat("rank ", r, ": attention_masks"); });
}

// The blobs' verdict: the first rank in another call, the lowest rank's
// error, the first spec that differs from rank 0's; else what they carry.
// Decided from the same bytes on every rank, so the same everywhere.
// `probing_ranks`: how many ranks (from 0) probe the service.
absl::StatusOr<Gathered> Digest(const std::vector<std::string>& all, int probing_ranks) {
  std::vector<RankBlob> blobs(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (!Unpack(all[r], &blobs[r])) {
      return absl::InternalError(absl::StrCat("rank ", r, " sent malformed metadata"));
    }
  }
  for (size_t r = 1; r < blobs.size(); ++r) {
    if (blobs[r].kind != blobs[0].kind) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " is in ", CallName(blobs[r].kind), " while rank 0 is in ",
          CallName(blobs[0].kind), "; every rank must prefetch a step, or none"));
    }
  }
  for (size_t r = 0; r < blobs.size(); ++r) {
    if (!blobs[r].error.empty()) {
      return absl::Status(static_cast<absl::StatusCode>(blobs[r].error_code),
                          absl::StrCat("rank ", r, ": ", blobs[r].error));
    }
  }
  Gathered gathered;
  // Before the lengths move out of the blobs: the check needs them.
  absl::StatusOr<RankMasks> masks = GatheredMasks(blobs);
  if (!masks.ok()) return masks.status();
  gathered.masks = *std::move(masks);
  gathered.lengths.resize(blobs.size());
  gathered.timings.resize(blobs.size());
  gathered.probes_answered = true;
  for (size_t r = 0; r < blobs.size(); ++r) {
    if (blobs[r].spec != blobs[0].spec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec: rank ", r, "'s step spec differs from rank 0's; every rank of a step must "
          "send the same spec (job, step, topology, cost model, token cap, locality)"));
    }
    if (static_cast<int>(r) < probing_ranks) {
      gathered.probes_answered = gathered.probes_answered && blobs[r].probe_answered;
    }
    gathered.lengths[r] = std::move(blobs[r].lengths);
    if (blobs[r].timing_seconds > 0) {
      gathered.timings[r].set_step(blobs[r].timing_step);
      gathered.timings[r].set_compute_seconds(blobs[r].timing_seconds);
      gathered.any_timing = true;
    }
  }
  return gathered;
}

std::string ComparedSpec(const v1::StepSpec& spec) {
  // token_bytes only prices the moved tokens (the service takes the first
  // rank's): ranks need not agree on it, and a step need not match its
  // prefetch on it.
  v1::StepSpec compared = spec;
  compared.clear_token_bytes();
  return compared.SerializeAsString();
}

// Why a step cannot use what was prefetched for it; empty if it can.
std::string PrefetchMismatch(const v1::StepSpec& prefetched_spec,
                             const std::vector<int64_t>& prefetched,
                             const std::vector<AttentionMask>& prefetched_masks,
                             const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                             const std::vector<AttentionMask>& masks) {
  if (ComparedSpec(prefetched_spec) != ComparedSpec(spec)) {
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
  return absl::StrCat("step ", spec.step(),
                      ": its lengths differ from those prefetched for it (", where,
                      "); prefetch the lengths the step will use");
}

// `rank`'s StepPlan from the whole plan, its figures from the plan's
// workloads.
StepPlan StepPlanOf(Plan plan, int32_t rank, PlanSource source) {
  StepPlan result;
  result.plan = plan.Slice(rank);
  result.source = source;
  result.max_over_mean_before = ComputeBalanceStats(plan.workload_before).max_over_mean;
  result.max_over_mean_after = ComputeBalanceStats(plan.workload_after).max_over_mean;
  result.total_tokens = plan.TotalTokens();
  result.moved_tokens = plan.MovedTokens();
  result.layout = plan.topology;
  result.workload_before = plan.workload_before;
  result.workload_after = plan.workload_after;
  result.whole = std::make_shared<const Plan>(std::move(plan));
  return result;
}

// Lets a caller stop an RPC running on another thread: it cancels the
// attempt in flight and the backoff sleep between attempts.
class CancelToken {
 public:
  // False, and nothing is registered, once cancelled.
  bool Enter(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    current_ = context;
    return true;
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mu_);
    current_ = nullptr;
  }
  // False if cancelled while sleeping.
  bool SleepFor(absl::Duration duration) {
    std::unique_lock<std::mutex> lock(mu_);
    return !wake_.wait_for(lock, absl::ToChronoNanoseconds(duration),
                           [this] { return cancelled_; });
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (current_ != nullptr) current_->TryCancel();
    wake_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  grpc::ClientContext* current_ = nullptr;
  bool cancelled_ = false;
};

// One call, retried on UNAVAILABLE with exponential backoff; the last status.
grpc::Status CallWithRetries(const PlannerClientOptions& options, CancelToken* token,
                             const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "cancelled: the step moved on");
  absl::Duration backoff = options.initial_backoff;
  // The attempts share the step's deadline: a retry on another replica
  // (round_robin picks the next ready one) takes what the first left.
  const absl::Time deadline = absl::Now() + options.call_deadline;
  grpc::Status status;
  for (int attempt = 1; attempt <= std::max(1, options.max_attempts); ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    if (token != nullptr && !token->Enter(&context)) return cancelled;
    status = call(&context);
    if (token != nullptr) token->Leave();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        attempt == options.max_attempts) {
      break;
    }
    // The first retry goes at once: with several replicas it lands on
    // another one, ready now. Later ones wait for a restart.
    if (attempt == 1) continue;
    if (absl::Now() + backoff >= deadline) break;
    if (token != nullptr) {
      if (!token->SleepFor(backoff)) return cancelled;
    } else {
      absl::SleepFor(backoff);
    }
    backoff = std::min(backoff * 2, options.max_backoff);
  }
  return status;
}

// An RPC on its own thread, so that a step is planned while the previous
// one computes. Destroying it cancels the RPC and waits for the thread.
class BackgroundCall {
 public:
  explicit BackgroundCall(std::function<grpc::Status(CancelToken*)> body)
      : thread_([this, body = std::move(body)] { status_ = body(&token_); }) {}
  ~BackgroundCall() {
    token_.Cancel();
    if (thread_.joinable()) thread_.join();
  }
  grpc::Status Wait() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  CancelToken token_;
  grpc::Status status_;
  std::thread thread_;  // last: starts once the others exist
};
// Probes the service in the background while the ranks plan without it: a
// GetJob with a short deadline every interval. Any answer from the service
// (NOT_FOUND included) counts; no answer (UNAVAILABLE, DEADLINE_EXCEEDED)
// does not. Steps only read the last result, so a hung service never
// stalls one.
class Prober {
 public:
  Prober(v1::Planner::Stub* stub, absl::Duration interval, absl::Duration deadline)
      : stub_(stub), interval_(interval), deadline_(deadline) {}
  ~Prober() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Starts probing (again), forgetting earlier answers.
  void Start(const std::string& job_id) {
    std::lock_guard<std::mutex> lock(mu_);
    job_id_ = job_id;
    answered_ = false;
    probing_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    wake_.notify_all();
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    probing_ = false;
  }
  bool answered() const { return answered_.load(); }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (!probing_) {
        wake_.wait(lock, [this] { return stopping_ || probing_; });
        continue;
      }
      v1::GetJobRequest request;
      request.set_job_id(job_id_);
      lock.unlock();
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
      // Waits (within the deadline) for a connection instead of failing at
      // once while the channel backs off: a probe is what makes an idle
      // channel reconnect to a restarted service.
      context.set_wait_for_ready(true);
      v1::JobState state;
      const grpc::Status status = stub_->GetJob(&context, request, &state);
      const bool answered = status.error_code() != grpc::StatusCode::UNAVAILABLE &&
                            status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
      lock.lock();
      if (probing_) answered_ = answered;
      wake_.wait_for(lock, absl::ToChronoNanoseconds(interval_), [this] { return stopping_; });
    }
  }

  v1::Planner::Stub* const stub_;
  const absl::Duration interval_;
  const absl::Duration deadline_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::string job_id_;
  bool probing_ = false;
  bool stopping_ = false;
  std::atomic<bool> answered_{false};
  std::thread thread_;
};

// A failure within this many steps of going back to the service is a
// relapse; the local stretch after one doubles, up to kMaxHoldSteps.
constexpr uint64_t kRelapseSteps = 16;
constexpr uint64_t kMaxHoldSteps = 256;

}  // namespace

const char* PlanSourceName(PlanSource source) {
  return source == PlanSource::kService ? "planner service" : "local planner";
}

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
  PlannerClientOptions options;
  Transport* transport;
  bool has_service = false;  // an address is configured
  // Null without a service, and in group mode on every rank but 0.
  std::unique_ptr<v1::Planner::Stub> stub;
  // Of the current Plan call, the time spent blocked on the service's answer.
  double service_wait_seconds = 0;
  // The service failed a step and has not answered every probing rank's
  // probe since (the same on every rank: decided from all-gathered
  // outcomes and probes, or from rank 0's broadcast).
  bool service_down = false;
  // Steps planned locally although a service is configured, and why the
  // last one was (the summary's figures; a warning every kLocalStepsWarning).
  int64_t local_steps = 0;
  std::string local_reason;
  static constexpr int64_t kLocalStepsWarning = 100;

  // Why the online gamma fit is not used, logged by rank 0 when it changes
  // (a fit that never comes is otherwise silent).
  std::string last_gamma_note;
  bool gamma_note_logged = false;
  void LogGammaNote(const v1::StepSpec& spec, const std::string& note, double gamma) {
    if (transport->rank() != 0 || (gamma_note_logged && note == last_gamma_note)) return;
    gamma_note_logged = true;
    last_gamma_note = note;
    Log(note.empty() ? LogLevel::kInfo : LogLevel::kWarning,
        note.empty() ? absl::StrCat("rank 0: step ", spec.step(),
                                    " is planned with the service's fitted gamma ", gamma)
                     : absl::StrCat("rank 0: online gamma fit not used at step ", spec.step(),
                                    ": ", note, "; planning with gamma ", gamma));
  }

  void CountLocalStep(const v1::StepSpec& spec) {
    ++local_steps;
    if (local_steps % kLocalStepsWarning != 0 || transport->rank() != 0) return;
    Log(LogLevel::kWarning,
        absl::StrCat("rank 0: ", local_steps, " steps planned locally so far, step ",
                     spec.step(), " included, although the planner service at ",
                     options.address, " is configured (last reason: ", local_reason,
                     "); set require_planner to make that an error"));
  }
  // A service that answers probes but fails steps (overloaded, slow to
  // plan) must not cost a step every few steps: each relapse soon after
  // coming back doubles the steps planned locally before it is asked again.
  // All step numbers, so the same on every rank.
  uint64_t down_since_step = 0;
  uint64_t back_at_step = 0;
  uint64_t hold_steps = 0;
  bool ever_back = false;
  std::unique_ptr<Prober> prober;  // where there is a stub
  bool logged = false;
  PlanSource last_source = PlanSource::kLocal;
  uint64_t incarnation = 0;
  std::unique_ptr<Prefetched> pending;
  static constexpr size_t kKeptWorkSteps = 16;
  bool ranks_send_timings = false;
  std::deque<std::pair<uint64_t, std::vector<WorkSample>>> recent_work;  // KeepWork

  bool group_mode() const { return options.mode == PlannerMode::kGroup; }
  bool leader() const { return transport->rank() == 0; }
  // The ranks whose probes decide that the service is back: those that ask it.
  int probing_ranks() const { return group_mode() ? 1 : transport->size(); }

  static uint64_t DrawIncarnation() {
    std::random_device device;
    uint64_t drawn = (uint64_t{device()} << 32) ^ device() ^
                     static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    return drawn == 0 ? 1 : drawn;
  }

  // Per-rank mode: every rank draws one and all take rank 0's (one 8-byte
  // all-gather). Group mode: only rank 0 sends requests, so its own draw is
  // the run's. Never 0 (which means none).
  absl::Status EnsureIncarnation() {
    if (incarnation != 0) return absl::OkStatus();
    uint64_t mine = options.incarnation != 0 ? options.incarnation : DrawIncarnation();
    if (group_mode()) {
      incarnation = mine;
      return absl::OkStatus();
    }
    auto all = transport->AllGatherBytes(
        std::string(reinterpret_cast<const char*>(&mine), sizeof(mine)));
    if (!all.ok()) return all.status();
    if ((*all)[0].size() != sizeof(mine)) {
      return absl::InternalError("rank 0: bad incarnation from the all-gather");
    }
    std::memcpy(&incarnation, (*all)[0].data(), sizeof(incarnation));
    return absl::OkStatus();
  }

  v1::StepSpec RequestSpec(const v1::StepSpec& spec) const {
    v1::StepSpec out = spec;
    if (spec.incarnation() == 0) out.set_incarnation(incarnation);
    return out;
  }

  v1::PlanRequest RankRequest(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                              const std::vector<AttentionMask>& masks,
                              const v1::StepTiming* previous) const {
    v1::PlanRequest request;
    *request.mutable_spec() = RequestSpec(spec);
    request.set_rank(transport->rank());
    request.mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
    for (const AttentionMask& mask : masks) MaskToProto(mask, request.add_attention_masks());
    if (previous != nullptr) *request.mutable_previous() = *previous;
    return request;
  }

  v1::PlanGroupRequest GroupRequest(const v1::StepSpec& spec, const Gathered& gathered) const {
    v1::PlanGroupRequest request;
    *request.mutable_spec() = RequestSpec(spec);
    request.mutable_ranks()->Reserve(static_cast<int>(gathered.lengths.size()));
    for (size_t r = 0; r < gathered.lengths.size(); ++r) {
      v1::RankLengths* rank = request.add_ranks();
      rank->mutable_sequence_lengths()->Add(gathered.lengths[r].begin(),
                                            gathered.lengths[r].end());
      if (gathered.masks.empty()) continue;
      for (const AttentionMask& mask : gathered.masks[r]) {
        MaskToProto(mask, rank->add_attention_masks());
      }
    }
    if (gathered.any_timing) {
      for (size_t r = 0; r < gathered.timings.size(); ++r) {
        v1::StepTiming* timing = request.add_previous();
        *timing = gathered.timings[r];
        if (timing->compute_seconds() <= 0) continue;
        for (const auto& [step, work] : recent_work) {
          if (step != timing->step() || r >= work.size()) continue;
          timing->set_linear_work(work[r].linear);
          timing->set_attention_work(work[r].attention);
        }
      }
    }
    return request;
  }

  // Group mode, rank 0, once the ranks send timings: keeps the work each
  // recent step's plan gave every rank, to send with the ranks' timings of
  // those steps (StepTiming.linear_work), so that whichever replica gets
  // the timing can fit gamma with it, not only the one that planned it.
  void KeepWork(const v1::StepSpec& spec, const Gathered& gathered, const StepPlan& step) {
    if (gathered.any_timing) ranks_send_timings = true;
    if (!leader() || !ranks_send_timings || step.whole == nullptr) return;
    recent_work.emplace_back(spec.step(),
                             RankWork(*step.whole, spec.d_model(),
                                      gathered.masks.empty() ? nullptr : &gathered.masks));
    while (recent_work.size() > kKeptWorkSteps) recent_work.pop_front();
  }

  grpc::Status AskRank(const v1::PlanRequest& request, v1::PlanResponse* response,
                       CancelToken* token) {
    return CallWithRetries(options, token, [&](grpc::ClientContext* context) {
      return stub->Plan(context, request, response);
    });
  }

  grpc::Status AskGroup(const v1::PlanGroupRequest& request, v1::PlanGroupResponse* response,
                        CancelToken* token) {
    return CallWithRetries(options, token, [&](grpc::ClientContext* context) {
      return stub->PlanGroup(context, request, response);
    });
  }

  void LogSource(PlanSource source, uint64_t step, const std::string& why) {
    if (logged && source == last_source) return;
    logged = true;
    last_source = source;
    Log(source == PlanSource::kLocal && has_service ? LogLevel::kWarning : LogLevel::kInfo,
        absl::StrCat("rank ", transport->rank(), ": planning from step ", step, " with the ",
                     PlanSourceName(source), why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }

  absl::Status CheckWorldSize(const v1::StepSpec& spec) const {
    if (spec.world_size() == transport->size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("spec.world_size: ", spec.world_size(),
                                                   " but the transport has ",
                                                   transport->size(), " ranks"));
  }

  RankBlob BlobFor(char kind, const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                   const std::vector<AttentionMask>& masks, const v1::StepTiming* previous,
                   const absl::Status& refused = absl::OkStatus()) const {
    RankBlob blob;
    blob.kind = kind;
    blob.probe_answered = service_down && prober != nullptr && prober->answered();
    blob.spec = ComparedSpec(spec);
    blob.lengths = lengths;
    if (!masks.empty() && refused.ok()) {
      v1::RankLengths mine;
      mine.mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
      for (const AttentionMask& mask : masks) MaskToProto(mask, mine.add_attention_masks());
      blob.masks = mine.SerializeAsString();
    }
    if (previous != nullptr && previous->compute_seconds() > 0) {
      blob.timing_step = previous->step();
      blob.timing_seconds = previous->compute_seconds();
    }
    if (absl::Status sized = CheckWorldSize(spec); !sized.ok()) {
      blob.error_code = static_cast<char>(sized.code());
      blob.error = std::string(sized.message());
    }
    if (!refused.ok()) {
      blob.error_code = static_cast<char>(refused.code());
      blob.error = std::string(refused.message());
    }
    return blob;
  }

  absl::StatusOr<Gathered> Gather(const RankBlob& mine) {
    auto all = transport->AllGatherBytes(Pack(mine));
    if (!all.ok()) return all.status();
    return Digest(*all, probing_ranks());
  }

  // When the service is down and every probing rank's probe was answered,
  // it is back up from the next step on (once the relapse hold is over), on
  // every rank alike.
  void MaybeBackUp(const v1::StepSpec& spec, bool probes_answered) {
    if (!service_down || !probes_answered || spec.step() + 1 < down_since_step + hold_steps) {
      return;
    }
    service_down = false;
    ever_back = true;
    back_at_step = spec.step() + 1;
    if (prober != nullptr) prober->Stop();
    Log(LogLevel::kInfo,
        absl::StrCat("rank ", transport->rank(), ": the planner service at ", options.address,
                     " answers ", group_mode() ? "rank 0" : "every rank",
                     " again; asking it from step ", spec.step() + 1));
  }

  // The error of a step the service did not plan, under require_service:
  // the same on every rank (decided from shared outcomes).
  absl::Status Required(const v1::StepSpec& spec, const std::string& why) const {
    return absl::UnavailableError(absl::StrCat(
        "step ", spec.step(), ": the planner service at ", options.address,
        " did not plan it (", why, ") and require_planner is set, so no rank plans it locally"));
  }

  // After a step the service failed: local planning, probes, a longer hold
  // after a relapse. Decided from shared outcomes: the same on every rank.
  void MarkDown(const v1::StepSpec& spec, const std::string& why) {
    local_reason = why;
    LogSource(PlanSource::kLocal, spec.step(),
              absl::StrCat(why, "; not asking it again until ",
                           group_mode() ? "rank 0's" : "every rank's", " probe is answered"));
    service_down = true;
    const bool relapse = ever_back && spec.step() < back_at_step + kRelapseSteps;
    hold_steps =
        relapse ? std::min<uint64_t>(std::max<uint64_t>(1, 2 * hold_steps), kMaxHoldSteps) : 0;
    down_since_step = spec.step();
    if (hold_steps > 0) {
      Log(LogLevel::kWarning,
          absl::StrCat("rank ", transport->rank(), ": the planner service failed step ",
                       spec.step(), " again ", spec.step() - back_at_step,
                       " steps after it was used again; planning locally for at least ",
                       hold_steps, " steps"));
    }
    if (prober != nullptr) prober->Start(spec.job_id());
  }

  // The step solved here, from every rank's lengths (every rank computes
  // the identical plan).
  absl::StatusOr<StepPlan> SolveLocally(const v1::StepSpec& spec, const RankLengths& group,
                                        const RankMasks& masks) {
    auto problem = StepProblemOf(spec);
    if (!problem.ok()) return problem.status();
    if (absl::Status locality = CheckLocality(spec); !locality.ok()) return locality;
    auto solved = SolveStep(*problem, problem->cost, group,
                            BalancerOptionsForSpec(options.balancer, spec), spec.token_bytes(),
                            &masks);
    if (!solved.ok()) return solved.status();
    StepPlan step = StepPlanOf(std::move(solved->plan), transport->rank(), PlanSource::kLocal);
    step.predicted_step_seconds = solved->predicted_seconds;
    return step;
  }

  // Every rank's lengths in one all-gather (with its probe's result and its
  // verdict on a prefetch), then the local solve.
  absl::StatusOr<StepPlan> PlanLocally(const v1::StepSpec& spec,
                                       const std::vector<int64_t>& lengths,
                                       const std::vector<AttentionMask>& masks,
                                       const std::string& mismatch,
                                       const absl::Status& refused = absl::OkStatus()) {
    RankBlob mine = BlobFor(kPlanCall, spec, lengths, masks, nullptr, refused);
    if (!mismatch.empty() && mine.error.empty()) {
      mine.error_code = static_cast<char>(absl::StatusCode::kFailedPrecondition);
      mine.error = mismatch;
    }
    absl::StatusOr<Gathered> gathered = Gather(mine);
    if (!gathered.ok()) return gathered.status();
    MaybeBackUp(spec, gathered->probes_answered);
    return SolveLocally(spec, gathered->lengths, gathered->masks);
  }

  absl::StatusOr<StepPlan> PlanPerRank(const v1::StepSpec& spec,
                                       const std::vector<int64_t>& lengths,
                                       const std::vector<AttentionMask>& masks,
                                       const absl::Status& refused,
                                       const v1::StepTiming* previous,
                                       std::unique_ptr<Prefetched> prefetched);
  absl::StatusOr<StepPlan> PlanGroup(const v1::StepSpec& spec,
                                     const std::vector<int64_t>& lengths,
                                     const std::vector<AttentionMask>& masks,
                                     const absl::Status& refused,
                                     const v1::StepTiming* previous,
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
  const std::string mismatch =
      prefetched != nullptr ? PrefetchMismatch(prefetched->spec, prefetched->lengths,
                                               prefetched->masks, spec, lengths, masks)
                            : "";
  if (!has_service) {
    LogSource(PlanSource::kLocal, spec.step(), "no planner service configured");
    return PlanLocally(spec, lengths, masks, mismatch, refused);
  }
  if (absl::Status agreed = EnsureIncarnation(); !agreed.ok()) return agreed;
  if (service_down) return PlanLocally(spec, lengths, masks, mismatch, refused);

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
    // with a bad length does: its peers wait in the rendezvous until its
    // timeout, then every rank learns of the refusal below.
    request = RankRequest(spec, {-1}, {}, previous);
    AskRank(request, &response, nullptr);
  } else {
    request = RankRequest(spec, lengths, masks, previous);
    status = AskRank(request, &response, nullptr);
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
  const Outcome outcome = mismatch.empty() ? Classify(status.error_code()) : kMismatch;
  // The outcome and the status code, then the rank's workloads under the
  // plan it got (so that every rank learns every rank's in the same
  // exchange) or the message.
  std::string mine = {static_cast<char>(outcome), static_cast<char>(status.error_code())};
  if (outcome == kGotPlan) {
    const double workloads[2] = {response.plan().workload_before(),
                                 response.plan().workload_after()};
    mine.append(reinterpret_cast<const char*>(workloads), sizeof(workloads));
  } else if (outcome == kMismatch) {
    mine[1] = static_cast<char>(absl::StatusCode::kFailedPrecondition);
    mine += mismatch;
  } else {
    mine += status.error_message();
  }
  auto all = transport->AllGatherBytes(mine);
  if (!all.ok()) return all.status();

  int32_t first_fallback = -1, first_conflict = -1;
  for (size_t r = 0; r < all->size(); ++r) {
    const std::string& blob = (*all)[r];
    if (blob.size() < 2 || (blob[0] == kGotPlan && blob.size() != 2 + 2 * sizeof(double))) {
      return absl::InternalError(absl::StrCat("rank ", r, ": bad outcome"));
    }
    const Outcome theirs = static_cast<Outcome>(blob[0]);
    if (theirs == kRefusedInput) {
      return absl::Status(static_cast<absl::StatusCode>(blob[1]),
                          absl::StrCat("rank ", r, "'s request was refused by the planner: ",
                                       blob.substr(2)));
    }
    if (theirs == kMismatch) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, ": ", blob.substr(2)));
    }
    if (theirs == kFallBack && first_fallback < 0) first_fallback = static_cast<int32_t>(r);
    if (theirs == kConflict && first_conflict < 0) first_conflict = static_cast<int32_t>(r);
  }
  if (first_fallback < 0 && first_conflict >= 0) {
    // Planning locally compares every rank's spec: if this run's own ranks
    // disagree, that is its error (FailedPrecondition naming the rank);
    // otherwise the conflict came from outside the run, and must neither
    // fail nor stall it. The service stays in use for the next step.
    const std::string why = absl::StrCat("rank ", first_conflict, ": ",
                                         (*all)[first_conflict].substr(2));
    if (options.require_service) return Required(spec, why);
    local_reason = why;
    absl::StatusOr<StepPlan> local = PlanLocally(spec, lengths, masks, "");
    if (local.ok()) {
      Log(LogLevel::kWarning,
          absl::StrCat("rank ", transport->rank(), ": step ", spec.step(),
                       " planned locally: the planner service at ", options.address,
                       " refused it for a conflict this run's ranks do not have (rank ",
                       first_conflict, ": ", (*all)[first_conflict].substr(2),
                       "); another client sends job id '", spec.job_id(), "' with incarnation ",
                       absl::Hex(request.spec().incarnation()),
                       " (set by the caller, or copied from this run)"));
    }
    return local;
  }
  if (first_fallback >= 0) {
    const std::string why = absl::StrCat("rank ", first_fallback, " could not get its plan from ",
                                         options.address, ": ", (*all)[first_fallback].substr(2));
    if (options.require_service) return Required(spec, why);
    MarkDown(spec, why);
    return PlanLocally(spec, lengths, masks, "");
  }
  LogSource(PlanSource::kService, spec.step(), options.address);
  StepPlan result;
  result.plan = *std::move(plan);
  result.source = PlanSource::kService;
  result.max_over_mean_before = response.balance().max_over_mean_before();
  result.max_over_mean_after = response.balance().max_over_mean_after();
  result.total_tokens = response.balance().total_tokens();
  result.moved_tokens = response.balance().moved_tokens();
  result.layout = response.balance().layout();
  result.predicted_step_seconds = response.balance().predicted_step_seconds();
  result.gamma_note = response.balance().gamma_note();
  result.gamma_used = response.balance().gamma_used();
  result.workload_before.resize(all->size());
  result.workload_after.resize(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    double workloads[2];
    std::memcpy(workloads, (*all)[r].data() + 2, sizeof(workloads));
    result.workload_before[r] = workloads[0];
    result.workload_after[r] = workloads[1];
  }
  return result;
}

namespace {

// This rank's step plan from rank 0's answer (a serialized
// PlanGroupResponse): the plan rebuilt from its chunk table and checked
// against every rank's lengths. Internal naming the problem when the
// answer is not a valid plan of this step.
absl::StatusOr<StepPlan> PlanFromGroupAnswer(const v1::StepSpec& spec, const Gathered& gathered,
                                             const std::string& payload, int32_t rank) {
  v1::PlanGroupResponse response;
  if (!response.ParseFromString(payload)) {
    return absl::InternalError("the answer is not a PlanGroupResponse");
  }
  if (response.job_id() != spec.job_id() || response.step() != spec.step()) {
    return absl::InternalError(absl::StrCat("the answer is for job '", response.job_id(),
                                            "' step ", response.step(), ", not job '",
                                            spec.job_id(), "' step ", spec.step()));
  }
  auto chunks = ChunksFromProto(response.chunks());
  if (!chunks.ok()) return chunks.status();
  auto problem = StepProblemOf(spec);
  if (!problem.ok()) return problem.status();
  auto world = WorldOfLayout(*problem, response.balance().layout());
  if (!world.ok()) return world.status();
  if (!gathered.masks.empty() && !response.balance().attention_masks()) {
    // A service from before masks ignores them: its plan is mask-blind.
    return absl::UnimplementedError("the service ignored the attention masks (it predates them)");
  }
  auto plan = PlanFromChunks(*world, problem->cost, gathered.lengths, *std::move(chunks),
                             &gathered.masks);
  if (!plan.ok()) return plan.status();
  const int world_size = spec.world_size();
  if (response.workload_before_size() != world_size ||
      response.workload_after_size() != world_size) {
    return absl::InternalError(absl::StrCat("the answer has ", response.workload_before_size(),
                                            " and ", response.workload_after_size(),
                                            " workloads for ", world_size, " ranks"));
  }
  // The service's workloads: under a fitted gamma they are not this
  // rank's cost model's. Its max/mean figures are computed from them, as
  // the service computes them (BalanceToProto).
  plan->workload_before.assign(response.workload_before().begin(),
                               response.workload_before().end());
  plan->workload_after.assign(response.workload_after().begin(),
                              response.workload_after().end());
  StepPlan step = StepPlanOf(*std::move(plan), rank, PlanSource::kService);
  step.predicted_step_seconds = response.balance().predicted_step_seconds();
  step.gamma_note = response.balance().gamma_note();
  step.gamma_used = response.balance().gamma_used();
  return step;
}

}  // namespace

absl::StatusOr<StepPlan> PlannerClient::Rep::PlanGroup(const v1::StepSpec& spec,
                                                       const std::vector<int64_t>& lengths,
                                                       const std::vector<AttentionMask>& masks,
                                                       const absl::Status& refused,
                                                       const v1::StepTiming* previous,
                                                       std::unique_ptr<Prefetched> prefetched) {
  Gathered gathered;
  if (prefetched != nullptr) {
    // The lengths went out with the prefetch: only the ranks' verdicts now.
    RankBlob mine;
    mine.kind = kPrefetchedCall;
    mine.error = PrefetchMismatch(prefetched->spec, prefetched->lengths, prefetched->masks, spec,
                                  lengths, masks);
    mine.error_code = static_cast<char>(absl::StatusCode::kFailedPrecondition);
    if (!refused.ok()) {
      mine.error = std::string(refused.message());
      mine.error_code = static_cast<char>(refused.code());
    }
    absl::StatusOr<Gathered> agreed = Gather(mine);
    if (!agreed.ok()) return agreed.status();
    gathered = *std::move(prefetched->gathered);
  } else {
    absl::StatusOr<Gathered> all =
        Gather(BlobFor(kPlanCall, spec, lengths, masks, previous, refused));
    if (!all.ok()) return all.status();
    gathered = *std::move(all);
  }
  if (!has_service) {
    LogSource(PlanSource::kLocal, spec.step(), "no planner service configured");
    return SolveLocally(spec, gathered.lengths, gathered.masks);
  }
  absl::StatusOr<StepPlan> result;
  if (service_down) {
    MaybeBackUp(spec, gathered.probes_answered);
    result = SolveLocally(spec, gathered.lengths, gathered.masks);
  } else {
    result = FinishGroup(spec, gathered, prefetched.get());
  }
  if (result.ok()) KeepWork(spec, gathered, *result);
  return result;
}

absl::StatusOr<StepPlan> PlannerClient::Rep::FinishGroup(const v1::StepSpec& spec,
                                                         const Gathered& gathered,
                                                         Prefetched* prefetched) {
  // Rank 0's answer: the outcome, the status code, then the response's
  // bytes or the service's message.
  std::string answer;
  if (leader()) {
    grpc::Status status;
    v1::PlanGroupResponse asked_now;
    const v1::PlanGroupResponse* response = &asked_now;
    const auto asked = std::chrono::steady_clock::now();
    if (prefetched != nullptr && prefetched->call != nullptr) {
      status = prefetched->call->Wait();
      response = &prefetched->group_response;
    } else if (absl::Status drawn = EnsureIncarnation(); !drawn.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, std::string(drawn.message()));
    } else {
      status = AskGroup(GroupRequest(spec, gathered), &asked_now, nullptr);
    }
    service_wait_seconds = SecondsSince(asked);
    const Outcome outcome = Classify(status.error_code());
    answer = {static_cast<char>(outcome), static_cast<char>(status.error_code())};
    if (outcome == kGotPlan) {
      answer += response->SerializeAsString();
    } else {
      answer += status.error_message();
    }
  }
  absl::StatusOr<std::string> got = transport->BroadcastBytes(0, answer);
  if (!got.ok()) return got.status();
  if (got->size() < 2) return absl::InternalError("rank 0: bad answer");
  const Outcome outcome = static_cast<Outcome>((*got)[0]);
  const std::string payload = got->substr(2);
  if (outcome == kRefusedInput) {
    return absl::Status(static_cast<absl::StatusCode>((*got)[1]),
                        absl::StrCat("rank 0's request was refused by the planner: ", payload));
  }
  if (outcome == kConflict) {
    if (options.require_service) return Required(spec, payload);
    local_reason = absl::StrCat("refused for a conflict: ", payload);
    absl::StatusOr<StepPlan> local = SolveLocally(spec, gathered.lengths, gathered.masks);
    if (local.ok()) {
      Log(LogLevel::kWarning,
          absl::StrCat("rank ", transport->rank(), ": step ", spec.step(),
                       " planned locally: the planner service at ", options.address,
                       " refused it for a conflict (", payload, ")"));
    }
    return local;
  }
  std::string why;
  if (outcome == kGotPlan) {
    // Every rank checks the same bytes against the same lengths: all take
    // the service's plan, or all find it malformed and fall back.
    absl::StatusOr<StepPlan> from_service =
        PlanFromGroupAnswer(spec, gathered, payload, transport->rank());
    if (from_service.ok()) {
      LogSource(PlanSource::kService, spec.step(), options.address);
      return from_service;
    }
    why = absl::StrCat("rank 0's answer from ", options.address,
                       " is malformed: ", from_service.status().message());
  } else {
    why = absl::StrCat("rank 0 could not get the plan from ", options.address, ": ", payload);
  }
  if (options.require_service) return Required(spec, why);
  MarkDown(spec, why);
  return SolveLocally(spec, gathered.lengths, gathered.masks);
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
  for (const auto& [name, value] : {std::make_pair("call_deadline", options.call_deadline),
                                    std::make_pair("probe_interval", options.probe_interval),
                                    std::make_pair("probe_deadline", options.probe_deadline)}) {
    if (!(value > absl::ZeroDuration())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be > 0, got ", absl::FormatDuration(value)));
    }
  }
  auto rep = std::make_unique<Rep>();
  rep->transport = transport;
  rep->has_service = !options.address.empty();
  if (options.require_service && !rep->has_service) {
    return absl::InvalidArgumentError(
        "require_planner: set, but no planner address is (planner_address= or "
        "KNAPFORMER_PLANNER_ADDRESS): there is no service to require");
  }
  if (rep->has_service && options.mode == PlannerMode::kPerRank) {
    if (const int replicas = PlannerTargetReplicas(options.address); replicas > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "planner_address: '", options.address, "' names ", replicas,
          " planner replicas, but per-rank mode needs every rank of a step to reach the same "
          "one (the ranks meet in its memory); use group mode (the default, which any replica "
          "answers) or one replica's address"));
    }
  }
  // In group mode only rank 0 talks to the service.
  if (rep->has_service && (options.mode == PlannerMode::kPerRank || transport->rank() == 0)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // this client retries itself
    // A target naming several replicas (dns:/// of a headless Service,
    // ipv4:a:p,b:q) spreads group steps over the ready ones, and a step
    // refused or lost by one is retried on the next.
    args.SetLoadBalancingPolicyName(options.mode == PlannerMode::kGroup ? "round_robin"
                                                                        : "pick_first");
    // Replicas replaced by a rolling update are found again within a
    // second of a disconnect, not gRPC's default 30 s between DNS queries.
    args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
    if (options.mode == PlannerMode::kGroup) {
      // A hung replica (stopped, wedged: its connection stays open) is found
      // by a ping unanswered while a step waits on it; its connection is
      // closed and the step, UNAVAILABLE, goes to another replica, so it
      // costs the step about 2 s, not its deadline and a local step. Pings
      // only while a call is in flight (the server accepts them that often:
      // planner_server.cc). Not in per-rank mode, whose calls wait in a
      // rendezvous and have no other replica to go to.
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
      // And through a long solve, not only its first two seconds (gRPC's
      // default stops after two pings until the client sends data).
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    }
    // A restarted service is found within seconds, not after gRPC's default
    // reconnect backoff (up to two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // A group's whole plan can exceed gRPC's default 4 MiB.
    args.SetMaxReceiveMessageSize(-1);
    auto credentials = options.credentials != nullptr ? options.credentials
                                                      : grpc::InsecureChannelCredentials();
    rep->stub = v1::Planner::NewStub(grpc::CreateCustomChannel(options.address, credentials, args));
    rep->prober =
        std::make_unique<Prober>(rep->stub.get(), options.probe_interval, options.probe_deadline);
  }
  rep->options = std::move(options);
  return std::unique_ptr<PlannerClient>(new PlannerClient(std::move(rep)));
}

absl::StatusOr<StepPlan> PlannerClient::Plan(const v1::StepSpec& spec,
                                             const std::vector<int64_t>& lengths,
                                             const v1::StepTiming* previous,
                                             const std::vector<AttentionMask>& masks,
                                             const absl::Status& caller_refused) {
  Rep& rep = *rep_;
  // This rank's own masks, checked before they become messages, so that an
  // unknown kind cannot pass as full.
  const absl::Status refused = !caller_refused.ok()
                                   ? caller_refused
                                   : CheckMaskList(lengths, masks, "attention_masks");
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
    if (rep.has_service && result->source == PlanSource::kLocal) rep.CountLocalStep(spec);
    if (spec.use_fitted_gamma()) {
      if (result->source == PlanSource::kLocal) {
        result->gamma_note = rep.has_service
                                 ? "planned locally: the fitted gamma lives in the service"
                                 : "no planner service: the fit is the service's";
      }
      rep.LogGammaNote(spec, result->gamma_note,
                       result->gamma_used > 0 ? result->gamma_used : spec.gamma());
    }
    result->local_steps = rep.local_steps;
    result->local_reason = rep.local_steps > 0 ? rep.local_reason : "";
  }
  return result;
}

absl::Status PlannerClient::Prefetch(const v1::StepSpec& spec,
                                     const std::vector<int64_t>& lengths,
                                     const v1::StepTiming* previous,
                                     const std::vector<AttentionMask>& masks,
                                     const absl::Status& caller_refused) {
  Rep& rep = *rep_;
  // This rank's own masks, checked before they become messages, so that an
  // unknown kind cannot pass as full.
  const absl::Status refused = !caller_refused.ok()
                                   ? caller_refused
                                   : CheckMaskList(lengths, masks, "attention_masks");
  rep.pending.reset();  // replaces an unused one, cancelling its call
  auto prefetched = std::make_unique<Prefetched>();
  prefetched->spec = spec;
  prefetched->lengths = lengths;
  prefetched->masks = masks;
  Prefetched* const p = prefetched.get();
  Rep* const r = &rep;
  if (rep.group_mode()) {
    absl::StatusOr<Gathered> gathered =
        rep.Gather(rep.BlobFor(kPrefetchCall, spec, lengths, masks, previous, refused));
    if (!gathered.ok()) return gathered.status();
    prefetched->gathered = *std::move(gathered);
    if (rep.stub != nullptr && !rep.service_down) {
      if (absl::Status drawn = rep.EnsureIncarnation(); !drawn.ok()) return drawn;
      auto request =
          std::make_shared<const v1::PlanGroupRequest>(rep.GroupRequest(spec, *p->gathered));
      prefetched->call = std::make_unique<BackgroundCall>([r, p, request](CancelToken* token) {
        return r->AskGroup(*request, &p->group_response, token);
      });
    }
  } else {
    if (absl::Status sized = rep.CheckWorldSize(spec); !sized.ok()) return sized;
    if (rep.has_service) {
      if (absl::Status agreed = rep.EnsureIncarnation(); !agreed.ok()) return agreed;
    }
    if (rep.stub != nullptr && !rep.service_down) {
      // A refused input asks with a length the service refuses; the step's
      // Plan reports the refusal on every rank.
      prefetched->request = refused.ok() ? rep.RankRequest(spec, lengths, masks, previous)
                                         : rep.RankRequest(spec, {-1}, {}, previous);
      prefetched->call = std::make_unique<BackgroundCall>([r, p](CancelToken* token) {
        return r->AskRank(p->request, &p->response, token);
      });
    }
  }
  rep.pending = std::move(prefetched);
  return absl::OkStatus();
}

}  // namespace knapformer
