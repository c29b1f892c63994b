#include "client/planner_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balance_stats.h"
#include "planner/cost_model.h"
#include "planner/topology.h"
#include "common/log.h"
#include "proto/plan_proto.h"

namespace knapformer {
namespace {

// What a rank tells the others after asking the service.
enum Outcome : char {
  kGotPlan = 0,
  kFallBack = 1,      // the service is unavailable, slow or overloaded
  kRefusedInput = 2,  // the service refused this rank's input: an error for all
  // The step conflicts with what the service already holds for it: another
  // run or a stray client with this job id opened it first (another spec),
  // or it was answered before (a run resumed from a checkpoint replays its
  // steps). Not this run's fault unless its own ranks disagree, which
  // planning locally checks.
  kConflict = 3
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

// What a rank sends for local planning: whether its background probe of
// the service was last answered (one byte), its spec and its lengths.
std::string PackLengths(bool probe_answered, const std::string& spec,
                        const std::vector<int64_t>& lengths) {
  const size_t head = 1 + sizeof(uint64_t);
  std::string blob(head + spec.size() + sizeof(int64_t) * lengths.size(), '\0');
  blob[0] = probe_answered ? 1 : 0;
  const uint64_t spec_size = spec.size();
  std::memcpy(blob.data() + 1, &spec_size, sizeof(spec_size));
  std::memcpy(blob.data() + head, spec.data(), spec.size());
  if (!lengths.empty()) {
    std::memcpy(blob.data() + head + spec.size(), lengths.data(),
                sizeof(int64_t) * lengths.size());
  }
  return blob;
}

// Splits a PackLengths blob; false if malformed.
bool UnpackLengths(const std::string& blob, bool* probe_answered, std::string* spec,
                   std::vector<int64_t>* lengths) {
  const size_t head = 1 + sizeof(uint64_t);
  uint64_t spec_size = 0;
  if (blob.size() < head) return false;
  *probe_answered = blob[0] == 1;
  std::memcpy(&spec_size, blob.data() + 1, sizeof(spec_size));
  const size_t rest = blob.size() - head;
  if (spec_size > rest || (rest - spec_size) % sizeof(int64_t) != 0) return false;
  spec->assign(blob.data() + head, spec_size);
  lengths->resize((rest - spec_size) / sizeof(int64_t));
  if (!lengths->empty()) {
    std::memcpy(lengths->data(), blob.data() + head + spec_size,
                sizeof(int64_t) * lengths->size());
  }
  return true;
}

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

struct PlannerClient::Rep {
  PlannerClientOptions options;
  Transport* transport;
  std::unique_ptr<v1::Planner::Stub> stub;  // null without a service
  // The service failed a step and has not answered every rank's probe since
  // (the same on every rank: decided from all-gathered outcomes and probes).
  bool service_down = false;
  // A service that answers probes but fails steps (overloaded, slow to
  // plan) must not cost a step every few steps: each relapse soon after
  // coming back doubles the steps planned locally before it is asked again.
  // All step numbers, so the same on every rank.
  uint64_t down_since_step = 0;
  uint64_t back_at_step = 0;
  uint64_t hold_steps = 0;
  bool ever_back = false;
  std::unique_ptr<Prober> prober;  // with a service
  bool logged = false;
  PlanSource last_source = PlanSource::kLocal;
  uint64_t incarnation = 0;  // agreed at the first step with a service

  // Every rank draws one; all take rank 0's. Never 0 (which means none).
  absl::Status AgreeOnIncarnation() {
    uint64_t mine = options.incarnation;
    if (mine == 0) {
      std::random_device device;
      mine = (uint64_t{device()} << 32) ^ device() ^
             static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
      if (mine == 0) mine = 1;
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

  // Asks the service, retrying UNAVAILABLE; the last status.
  grpc::Status AskService(const v1::PlanRequest& request, v1::PlanResponse* response) {
    absl::Duration backoff = options.initial_backoff;
    grpc::Status status;
    for (int attempt = 1; attempt <= std::max(1, options.max_attempts); ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options.call_deadline));
      status = stub->Plan(&context, request, response);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          attempt == options.max_attempts) {
        break;
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, options.max_backoff);
    }
    return status;
  }

  void LogSource(PlanSource source, uint64_t step, const std::string& why) {
    if (logged && source == last_source) return;
    logged = true;
    last_source = source;
    Log(source == PlanSource::kLocal && stub != nullptr ? LogLevel::kWarning : LogLevel::kInfo,
        absl::StrCat("rank ", transport->rank(), ": planning from step ", step, " with the ",
                     PlanSourceName(source), why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }

  // Every rank's lengths in one all-gather, with its probe's result: when
  // the service is down and every rank's probe was answered, it is back up
  // from the next step on, on every rank alike.
  absl::StatusOr<StepPlan> PlanLocally(const v1::StepSpec& spec,
                                       const std::vector<int64_t>& lengths) {
    // token_bytes only prices the moved tokens (the service takes the first
    // rank's): ranks need not agree on it, here as there.
    v1::StepSpec compared = spec;
    compared.clear_token_bytes();
    const std::string my_spec = compared.SerializeAsString();
    const bool probed = service_down && prober->answered();
    auto all = transport->AllGatherBytes(PackLengths(probed, my_spec, lengths));
    if (!all.ok()) return all.status();
    RankLengths group(all->size());
    bool every_probe_answered = service_down;
    for (size_t r = 0; r < all->size(); ++r) {
      std::string spec_bytes;
      bool answered = false;
      if (!UnpackLengths((*all)[r], &answered, &spec_bytes, &group[r])) {
        return absl::InternalError(absl::StrCat("rank ", r, " sent malformed metadata"));
      }
      every_probe_answered = every_probe_answered && answered;
      if (spec_bytes != my_spec) {
        return absl::FailedPreconditionError(absl::StrCat(
            "spec: rank ", r, "'s step spec differs from rank ", transport->rank(),
            "'s; every rank of a step must send the same spec (job, step, topology, cost "
            "model, token cap, locality)"));
      }
    }
    if (every_probe_answered && spec.step() + 1 >= down_since_step + hold_steps) {
      service_down = false;
      ever_back = true;
      back_at_step = spec.step() + 1;
      prober->Stop();
      Log(LogLevel::kInfo, absl::StrCat("rank ", transport->rank(), ": the planner service at ",
                                        options.address, " answers every rank again; asking it "
                                        "from step ", spec.step() + 1));
    }
    auto topology = Topology::Parse(spec.topology());
    if (!topology.ok()) return topology.status();
    auto world = World::Create(*std::move(topology), spec.world_size());
    if (!world.ok()) return world.status();
    auto cost = CostModelFromSpec(spec);
    if (!cost.ok()) return cost.status();
    if (absl::Status locality = CheckLocality(spec); !locality.ok()) return locality;
    auto plan = BalanceGreedy(*world, *cost, group, BalancerOptionsForSpec(options.balancer, spec));
    if (!plan.ok()) return plan.status();
    StepPlan result;
    result.plan = plan->Slice(transport->rank());
    result.source = PlanSource::kLocal;
    result.max_over_mean_before = ComputeBalanceStats(plan->workload_before).max_over_mean;
    result.max_over_mean_after = ComputeBalanceStats(plan->workload_after).max_over_mean;
    result.total_tokens = plan->TotalTokens();
    result.moved_tokens = plan->MovedTokens();
    result.workload_before = std::move(plan->workload_before);
    result.workload_after = std::move(plan->workload_after);
    return result;
  }
};

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
  if (!options.address.empty()) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // this client retries itself
    // A restarted service is found within seconds, not after gRPC's default
    // reconnect backoff (up to two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
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
                                             const v1::StepTiming* previous) {
  Rep& rep = *rep_;
  if (spec.world_size() != rep.transport->size()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.world_size: ", spec.world_size(),
                                                   " but the transport has ",
                                                   rep.transport->size(), " ranks"));
  }
  if (rep.stub == nullptr) {
    rep.LogSource(PlanSource::kLocal, spec.step(), "no planner service configured");
    return rep.PlanLocally(spec, lengths);
  }
  if (rep.incarnation == 0) {
    if (absl::Status agreed = rep.AgreeOnIncarnation(); !agreed.ok()) return agreed;
  }
  if (rep.service_down) return rep.PlanLocally(spec, lengths);

  v1::PlanRequest request;
  *request.mutable_spec() = spec;
  if (spec.incarnation() == 0) request.mutable_spec()->set_incarnation(rep.incarnation);
  request.set_rank(rep.transport->rank());
  request.mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
  if (previous != nullptr) *request.mutable_previous() = *previous;
  v1::PlanResponse response;
  grpc::Status status = rep.AskService(request, &response);
  // A plan that is not even well-formed (columns of different lengths) is
  // the service failing, like an error: every rank falls back together.
  absl::StatusOr<RankPlan> plan = absl::UnknownError("no plan");
  if (status.ok()) {
    plan = RankPlanFromProto(response.plan(), spec.world_size());
    if (!plan.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL,
                            std::string("the service's answer is malformed: ") +
                                std::string(plan.status().message()));
    }
  }
  const Outcome outcome = Classify(status.error_code());
  // The outcome and the status code, then the rank's workloads under the
  // plan it got (so that every rank learns every rank's in the same
  // exchange) or the service's message.
  std::string mine = {static_cast<char>(outcome), static_cast<char>(status.error_code())};
  if (outcome == kGotPlan) {
    const double workloads[2] = {response.plan().workload_before(),
                                 response.plan().workload_after()};
    mine.append(reinterpret_cast<const char*>(workloads), sizeof(workloads));
  } else {
    mine += status.error_message();
  }
  auto all = rep.transport->AllGatherBytes(mine);
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
    if (theirs == kFallBack && first_fallback < 0) first_fallback = static_cast<int32_t>(r);
    if (theirs == kConflict && first_conflict < 0) first_conflict = static_cast<int32_t>(r);
  }
  if (first_fallback < 0 && first_conflict >= 0) {
    // Planning locally compares every rank's spec: if this run's own ranks
    // disagree, that is its error (FailedPrecondition naming the rank);
    // otherwise the conflict came from outside the run, and must neither
    // fail nor stall it. The service stays in use for the next step.
    absl::StatusOr<StepPlan> local = rep.PlanLocally(spec, lengths);
    if (local.ok()) {
      Log(LogLevel::kWarning,
          absl::StrCat("rank ", rep.transport->rank(), ": step ", spec.step(),
                       " planned locally: the planner service at ", rep.options.address,
                       " refused it for a conflict this run's ranks do not have (rank ",
                       first_conflict, ": ", (*all)[first_conflict].substr(2),
                       "); another client sends job id '", spec.job_id(), "' with incarnation ",
                       absl::Hex(request.spec().incarnation()),
                       " (set by the caller, or copied from this run)"));
    }
    return local;
  }
  if (first_fallback >= 0) {
    rep.LogSource(PlanSource::kLocal, spec.step(),
                  absl::StrCat("rank ", first_fallback, " could not get its plan from ",
                               rep.options.address, ": ", (*all)[first_fallback].substr(2),
                               "; not asking it again until every rank's probe is answered"));
    // Decided from the all-gathered outcomes: the same on every rank.
    rep.service_down = true;
    const bool relapse = rep.ever_back && spec.step() < rep.back_at_step + kRelapseSteps;
    rep.hold_steps = relapse ? std::min<uint64_t>(std::max<uint64_t>(1, 2 * rep.hold_steps),
                                                  kMaxHoldSteps)
                             : 0;
    rep.down_since_step = spec.step();
    if (rep.hold_steps > 0) {
      Log(LogLevel::kWarning,
          absl::StrCat("rank ", rep.transport->rank(), ": the planner service failed step ",
                       spec.step(), " again ", spec.step() - rep.back_at_step,
                       " steps after it was used again; planning locally for at least ",
                       rep.hold_steps, " steps"));
    }
    rep.prober->Start(spec.job_id());
    return rep.PlanLocally(spec, lengths);
  }
  rep.LogSource(PlanSource::kService, spec.step(), rep.options.address);
  StepPlan result;
  result.plan = *std::move(plan);
  result.source = PlanSource::kService;
  result.max_over_mean_before = response.balance().max_over_mean_before();
  result.max_over_mean_after = response.balance().max_over_mean_after();
  result.total_tokens = response.balance().total_tokens();
  result.moved_tokens = response.balance().moved_tokens();
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

}  // namespace knapformer
