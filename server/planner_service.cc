#include "server/planner_service.h"

#include <algorithm>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "planner/balance_stats.h"
#include "planner/measured_fit.h"
#include "planner/rank_speeds.h"
#include "planner/step_solve.h"
#include "proto/mask_proto.h"
#include "proto/plan_proto.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tsan_handoff.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "server/arena_messages.h"
#include "server/cpu_quota.h"
#include "server/request_check.h"
#include "server/request_scan.h"

namespace knapformer {
namespace {

// The job label of a request: its job_id when valid, else "".
std::string JobLabel(const std::string& job_id) {
  return CheckJobId(job_id).ok() ? job_id : std::string();
}

int SolverThreads(int requested) {
  if (requested > 0) return requested;
  return AvailableCpus();
}

// How often the reaper looks for new steps when none is pending (it sleeps
// until the earliest deadline otherwise) and for idle jobs.
constexpr absl::Duration kReapInterval = absl::Milliseconds(200);

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

// A unary reactor that counts its call from arrival until gRPC is done with
// it (the answer sent, or the call cancelled), for WaitForAnswers, and then
// deletes itself, giving back the request memory it was charged. Every
// call's reactor is one; a raw call's answers with its response serialized
// into gRPC's buffer.
//
// gRPC calls OnCancel and OnDone on its threads after the handler returned
// the reactor or called Finish: Returned and FinishCall mark those handoffs
// for TSan (common/tsan_handoff.h), OnCancel and OnDone take them over.
class PlannerService::CountedReactor : public grpc::ServerUnaryReactor {
 public:
  explicit CountedReactor(PlannerService* service, grpc::ByteBuffer* wire_response = nullptr)
      : service_(service), wire_response_(wire_response) {
    service_->CallArrived();
  }
  void OnDone() override {
    TakeOver(this);
    if (charged_bytes_ > 0) {
      service_->request_memory_.Give(caller_tenant_, caller_job_, charged_bytes_);
    }
    service_->CallAnswered();
    delete this;
  }
  // What a handler returns: this reactor, handed to gRPC.
  grpc::ServerUnaryReactor* Returned() {
    HandOff(this);
    return this;
  }
  // With OK and a raw call, `response` is the answer.
  void FinishCall(const absl::Status& status,
                  const google::protobuf::MessageLite* response = nullptr) {
    grpc::Status result = ToGrpcStatus(status);
    if (status.ok() && wire_response_ != nullptr && response != nullptr) {
      bool own_buffer = false;
      result = grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
          *response, wire_response_, &own_buffer);
    }
    HandOff(this);
    Finish(result);
  }
  // The tenant the caller was authorized for (Admit), and the job charged.
  void set_caller(std::string tenant, std::string job) {
    caller_tenant_ = std::move(tenant);
    caller_job_ = std::move(job);
  }
  const std::string& caller_tenant() const { return caller_tenant_; }
  // Charges `bytes` of request memory to the caller until OnDone.
  absl::Status Charge(int64_t bytes) {
    KF_RETURN_IF_ERROR(service_->request_memory_.Take(caller_tenant_, caller_job_, bytes));
    charged_bytes_ = bytes;
    return absl::OkStatus();
  }

 protected:
  PlannerService* const service_;

 private:
  grpc::ByteBuffer* const wire_response_;
  std::string caller_tenant_;
  std::string caller_job_;
  int64_t charged_bytes_ = 0;
};

// One rank's Plan call. Answered exactly once: by the fan-out of its solved
// step, with the error of its step (timeout, drain), or at once when refused.
// Deletes itself when gRPC is done with it (CountedReactor).
class PlannerService::PlanCall final : public CountedReactor, public PendingCall {
 public:
  PlanCall(PlannerService* service, grpc::ByteBuffer* wire_response)
      : CountedReactor(service, wire_response) {}

  const v1::PlanRequest& request() const override { return *messages_.request(); }
  const std::string& tenant() const override { return caller_tenant(); }
  v1::PlanRequest* mutable_request() { return messages_.request(); }

  void Answer(const knapformer::Plan& plan, const v1::Balance& balance) {
    const v1::StepSpec& spec = request().spec();
    v1::PlanResponse* response = messages_.response();
    response->set_job_id(spec.job_id());
    response->set_group_id(spec.group_id());
    response->set_step(spec.step());
    RankPlanToProto(plan.Slice(request().rank()), response->mutable_plan());
    *response->mutable_balance() = balance;
    FinishWith(absl::OkStatus());
  }

  // `named_job`: the call may be counted under the job it names (false for
  // a caller refused as that job, who must not add labels).
  void FinishWith(const absl::Status& status, bool named_job = true) {
    service_->metrics_.CountRequest(named_job ? JobLabel(request().spec().job_id()) : "",
                                    "Plan", status.code(), absl::Now());
    if (!status.ok() && LogEnabled(LogLevel::kDebug)) {
      Log(LogLevel::kDebug, absl::StrCat("Plan: ", status.ToString()));
    }
    FinishCall(status, messages_.response());
  }

  // Whether gRPC cancelled the call (the rank gave up, or its deadline
  // passed), also after its step left the rendezvous.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  void OnCancel() override {
    TakeOver(this);
    cancelled_.store(true, std::memory_order_release);
    if (service_->rendezvous_.Leave(this)) {
      FinishWith(absl::CancelledError(absl::StrCat(
          "rank ", request().rank(), " cancelled and left step ", request().spec().step())));
    }
  }

 private:
  ArenaMessages<v1::PlanRequest, v1::PlanResponse> messages_;
  std::atomic<bool> cancelled_{false};
};

// One PlanGroup call: its messages, and its place among the calls in flight.
class PlannerService::PlanGroupCall final : public CountedReactor {
 public:
  PlanGroupCall(PlannerService* service, grpc::ByteBuffer* wire_response)
      : CountedReactor(service, wire_response) {}

  ArenaMessages<v1::PlanGroupRequest, v1::PlanGroupResponse> messages;
};

// One GetJob call.
class PlannerService::GetJobCall final : public CountedReactor {
 public:
  GetJobCall(PlannerService* service, grpc::ByteBuffer* wire_response)
      : CountedReactor(service, wire_response) {}

  ArenaMessages<v1::GetJobRequest, v1::JobState> messages;
};

PlannerService::PlannerService(const ServiceOptions& options)
    : options_(options),
      scanner_(options.limits),
      rendezvous_(options.limits),
      cost_fits_(options.limits),
      metrics_(&rendezvous_, &cost_fits_, options.limits.max_jobs,
               options.metrics_gauge_interval),
      plan_group_calls_("max_plan_group_calls", "PlanGroup calls in flight",
                        {options.limits.max_plan_group_calls,
                         options.limits.max_plan_group_calls_per_tenant,
                         options.limits.max_plan_group_calls_per_job,
                         options.limits.max_plan_group_calls / 8}),
      request_memory_("max_request_memory", "bytes of requests",
                      {options.limits.max_request_memory,
                       options.limits.max_request_memory_per_tenant,
                       options.limits.max_request_memory_per_job,
                       options.limits.max_request_memory / 8}),
      pool_(SolverThreads(options.solver_threads)),
      reaper_([this] { Reap(); }) {}

PlannerService::~PlannerService() {
  {
    absl::MutexLock lock(&reaper_mu_);
    stop_reaper_ = true;
  }
  reaper_.join();
}

absl::StatusOr<std::string> PlannerService::Authorize(const grpc::CallbackServerContext& context,
                                                      const std::string& job_id) {
  if (options_.authorizer == nullptr) return job_id;
  return options_.authorizer->Authorize(context, job_id);
}

namespace {

// The job a request names, set before the rest is parsed: a refusal then
// counts under the job.
void SetJobId(const std::string& job_id, v1::PlanRequest* request) {
  request->mutable_spec()->set_job_id(job_id);
}
void SetJobId(const std::string& job_id, v1::PlanGroupRequest* request) {
  request->mutable_spec()->set_job_id(job_id);
}
void SetJobId(const std::string& job_id, v1::GetJobRequest* request) {
  request->set_job_id(job_id);
}
const std::string& JobIdOf(const v1::PlanRequest& request) { return request.spec().job_id(); }
const std::string& JobIdOf(const v1::PlanGroupRequest& request) {
  return request.spec().job_id();
}
const std::string& JobIdOf(const v1::GetJobRequest& request) { return request.job_id(); }

}  // namespace

template <typename Request>
absl::Status PlannerService::Admit(const grpc::CallbackServerContext& context,
                                   const grpc::ByteBuffer& wire, CountedReactor* reactor,
                                   Request* request, bool* authorized) {
  *authorized = false;
  grpc::ByteBuffer bytes(wire);  // the same slices, referenced again
  absl::StatusOr<RequestShape> shape;
  {
    grpc::ProtoBufferReader reader(&bytes);
    shape = scanner_.Scan(Request::descriptor(), &reader);
  }
  KF_RETURN_IF_ERROR(shape.status());
  // Before anything counts the call against the job it names.
  KF_ASSIGN_OR_RETURN(std::string tenant, Authorize(context, shape->job_id));
  *authorized = true;
  SetJobId(shape->job_id, request);
  reactor->set_caller(std::move(tenant), shape->job_id);
  KF_RETURN_IF_ERROR(shape->over_limit);
  KF_RETURN_IF_ERROR(reactor->Charge(EstimatedParsedBytes(*shape)));
  grpc::ProtoBufferReader reader(&bytes);
  if (!request->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: not a valid ", Request::descriptor()->name(), " (", wire.Length(),
                     " bytes; a string field is not UTF-8?)"));
  }
  // The job authorized is the job the request names (the scan reads the
  // job id as the parser does; this keeps it so).
  if (JobIdOf(*request) != shape->job_id) {
    return absl::InternalError("request: the parsed job id is not the one scanned");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* PlannerService::Plan(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* wire,
                                               grpc::ByteBuffer* wire_response) {
  auto* call = new PlanCall(this, wire_response);
  const v1::PlanRequest* request = call->mutable_request();
  bool authorized = false;
  if (absl::Status admitted = Admit(*context, *wire, call, call->mutable_request(), &authorized);
      !admitted.ok()) {
    call->FinishWith(admitted, /*named_job=*/authorized);
    return call->Returned();
  }
  auto checked = CheckPlanRequestRank(*request, options_.limits, &worlds_);
  if (!checked.ok()) {
    call->FinishWith(checked.status());
    return call->Returned();
  }
  if (absl::Status refused = CheckRankInput(*request, options_.limits); !refused.ok()) {
    // The step cannot complete: its other ranks learn so now, not at the
    // rendezvous timeout (a client whose own input check refused asks so).
    std::optional<FailedCalls> withdrawn =
        rendezvous_.Withdraw(request->spec(), *checked, request->rank(), refused, absl::Now());
    if (withdrawn.has_value()) {
      Log(LogLevel::kWarning, withdrawn->status.ToString());
      FinishCalls(withdrawn->calls, withdrawn->status);
    }
    call->FinishWith(refused);
    return call->Returned();
  }
  if (request->previous().compute_seconds() > 0) {
    cost_fits_.AddTiming(request->spec(), request->rank(), request->previous());
  }
  Rendezvous::Arrival arrival = rendezvous_.Arrive(call, *std::move(checked), absl::Now());
  SyncCostFits();
  for (const FailedCalls& evicted : arrival.evicted) FinishCalls(evicted.calls, evicted.status);
  if (!arrival.status.ok()) {
    call->FinishWith(arrival.status);
  } else if (arrival.ready != nullptr) {
    std::shared_ptr<ReadyStep> ready = std::move(arrival.ready);
    const int64_t sequences = ready->sequences;
    SolveNowOrSchedule(ready->tenant, request->spec().job_id(), sequences,
                       [this, ready](const absl::Status& admitted) {
                         if (!admitted.ok()) {
                           FinishCalls(ready->calls, admitted);
                           return;
                         }
                         SolveAndAnswer(ready);
                       });
  }
  return call->Returned();
}

absl::StatusOr<knapformer::Plan> PlannerService::SolveAndRecord(
    const v1::StepSpec& spec, const CheckedSpec& checked, BalancerInput&& input,
    double wait_seconds, v1::Balance* balance, const std::vector<double>& rank_speeds) {
  const absl::Time start = absl::Now();
  BalancerOptions balancer = BalancerOptionsForSpec(options_.balancer, spec);
  balancer.rank_speeds = rank_speeds;
  balancer.chunk_tables = &chunk_tables_;
  CostModel cost = checked.cost;
  std::string gamma_note;
  std::optional<MeasuredAttention> fitted_table;  // when it plans the step
  // The measured model's fitted part is its attention table.
  const bool fits_table = spec.use_fitted_gamma() && cost.kind() == CostKind::kMeasured;
  if (spec.use_fitted_gamma() && cost.kind() == CostKind::kTransformer) {
    if (std::optional<CostFit> fit = cost_fits_.FittedCost(spec.job_id(), &gamma_note)) {
      absl::StatusOr<CostModel> fitted = CostModel::Create(cost.d_model(), fit->gamma);
      if (fitted.ok()) {
        cost = *fitted;
      } else {
        gamma_note = absl::StrCat("the fitted gamma is not usable: ", fitted.status().message());
      }
    }
  } else if (fits_table) {
    if (std::optional<MeasuredAttention> table =
            cost_fits_.FittedTable(spec.job_id(), &gamma_note)) {
      absl::StatusOr<CostModel> fitted =
          CostModel::Create(cost.d_model(), cost.gamma(), CostKind::kMeasured, &*table);
      if (fitted.ok()) {
        cost = *fitted;
        fitted_table = *std::move(table);
      } else {
        gamma_note = absl::StrCat("the fitted table is not usable: ", fitted.status().message());
      }
    }
  } else if (spec.use_fitted_gamma()) {
    gamma_note = absl::StrCat("the ", CostKindName(cost.kind()),
                              " cost model has no gamma to fit");
  }
  absl::StatusOr<SolvedStep> step =
      SolveStep(checked, cost, std::move(input), balancer, spec.token_bytes());
  const absl::Time solved = absl::Now();
  if (!step.ok()) return step.status();
  absl::StatusOr<knapformer::Plan> plan = std::move(step->plan);
  // The input's masks moved into the plan.
  const RankMasks* masks = plan->MasksOrNull();
  *balance = BalanceToProto(*plan, spec.token_bytes(), absl::ToInt64Microseconds(solved - start));
  balance->set_predicted_step_seconds(step->predicted_seconds);
  balance->set_attention_masks(masks != nullptr);
  if (const std::vector<double> speeds = NormalizedRankSpeeds(rank_speeds); !speeds.empty()) {
    // By time against the ideal: what sets the step's time on these GPUs.
    const auto [before, after] = BalanceOf(*plan, rank_speeds);
    balance->set_wir_before(before.wir);
    balance->set_wir_after(after.wir);
    balance->set_max_over_mean_before(before.max_over_mean);
    balance->set_max_over_mean_after(after.max_over_mean);
    balance->mutable_rank_speeds()->Add(speeds.begin(), speeds.end());
  }
  if (spec.use_fitted_gamma()) {
    balance->set_gamma_used(cost.gamma());
    balance->set_gamma_note(gamma_note);
  }
  if (fitted_table.has_value()) {
    MeasuredAttentionToProto(*fitted_table, balance->mutable_fitted_attention_table());
  }
  std::vector<WorkSample> rank_work;
  std::vector<PairWeights> rank_weights;
  if (cost_fits_.WantsWork(spec.job_id())) {
    rank_work = RankWork(*plan, cost.d_model(), masks);
    if (fits_table) rank_weights = RankPairWeights(*plan, masks);
  }
  cost_fits_.RecordPlanned(spec, std::move(rank_work), std::move(rank_weights),
                            checked.cost.measured());
  rendezvous_.RecordPlanned(spec, plan->topology, *balance, solved);
  metrics_.RecordStep(spec.job_id(), *balance, spec.token_bytes(),
                      absl::ToDoubleSeconds(solved - start), wait_seconds, solved);
  return plan;
}

void PlannerService::SolveAndAnswer(std::shared_ptr<ReadyStep> step) {
  const v1::StepSpec& spec = step->spec;
  // A rank that gave up while the step waited for a solver plans it
  // locally, and so, by the step's agreement, do the others: no solve.
  for (size_t r = 0; r < step->calls.size(); ++r) {
    if (!static_cast<PlanCall*>(step->calls[r])->cancelled()) continue;
    const absl::Status gone = absl::AbortedError(absl::StrCat(
        "rank ", step->calls[r]->request().rank(), " gave up (cancelled, or past its deadline) "
        "before a solver took step ", spec.step(), "; not solved"));
    FinishCalls(step->calls, gone);
    return;
  }
  // Each request was checked on arrival, alone; the step as a whole
  // (whether every rank gave masks, the world's limits) only now, once, and
  // it fails the whole step.
  absl::StatusOr<BalancerInput> input = BalancerInputFromProto(
      static_cast<int32_t>(step->calls.size()),
      [&](int32_t r) -> const ProtoLengths& {
        return step->calls[r]->request().sequence_lengths();
      },
      [&](int32_t r) -> const ProtoMasks& { return step->calls[r]->request().attention_masks(); },
      [](int32_t r) { return absl::StrCat("rank ", r, ": attention_masks"); },
      options_.balancer.limits);
  v1::Balance solved_balance;
  absl::StatusOr<knapformer::Plan> plan =
      !input.ok() ? absl::StatusOr<knapformer::Plan>(input.status())
                  : SolveAndRecord(spec, step->checked, *std::move(input),
                                   absl::ToDoubleSeconds(step->last_arrival - step->first_arrival),
                                   &solved_balance);
  if (!plan.ok()) {
    Log(LogLevel::kWarning, absl::StrCat("job '", spec.job_id(), "' step ", spec.step(), ": ",
                                         plan.status().ToString()));
    FinishCalls(step->calls, plan.status());
    return;
  }
  auto balance = std::make_shared<const v1::Balance>(std::move(solved_balance));
  // Its chunk table goes back to the cache once the last answer is sent.
  std::shared_ptr<const knapformer::Plan> shared_plan(
      new knapformer::Plan(*std::move(plan)), [this](knapformer::Plan* answered) {
        chunk_tables_.GiveBack(std::move(answered->chunks));
        delete answered;
      });

  // Slicing and sending R answers costs ~10 us each: spread them over the pool.
  const size_t n = step->calls.size();
  const size_t pieces = std::min<size_t>(pool_.size(), (n + 63) / 64);
  const size_t per_piece = (n + pieces - 1) / pieces;
  for (size_t p = 1; p < pieces; ++p) {
    const size_t begin = p * per_piece;
    const size_t end = std::min(n, begin + per_piece);
    pool_.Schedule([this, shared_plan, step, balance, begin, end] {
      AnswerRange(shared_plan, step, balance, begin, end);
    });
  }
  AnswerRange(shared_plan, step, balance, 0, std::min(n, per_piece));
}

void PlannerService::AnswerRange(std::shared_ptr<const knapformer::Plan> plan,
                                 std::shared_ptr<ReadyStep> step,
                                 std::shared_ptr<const v1::Balance> balance, size_t begin,
                                 size_t end) {
  for (size_t r = begin; r < end; ++r) {
    static_cast<PlanCall*>(step->calls[r])->Answer(*plan, *balance);
  }
}

grpc::ServerUnaryReactor* PlannerService::PlanGroup(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* wire,
                                                    grpc::ByteBuffer* wire_response) {
  auto* call = new PlanGroupCall(this, wire_response);
  const v1::PlanGroupRequest* request = call->messages.request();
  v1::PlanGroupResponse* response = call->messages.response();
  bool authorized = false;
  absl::Status status = Admit(*context, *wire, call, call->messages.request(), &authorized);
  if (!authorized) {  // counted under no job
    metrics_.CountRequest("", "PlanGroup", status.code(), absl::Now());
    call->FinishCall(status);
    return call->Returned();
  }
  const std::string job = request->spec().job_id();
  const std::string tenant = call->caller_tenant();
  if (status.ok()) status = plan_group_calls_.Take(tenant, job, 1);
  const bool counted = status.ok();
  auto finish = [this, call, response, tenant, job, counted](const absl::Status& status) {
    if (counted) plan_group_calls_.Give(tenant, job, 1);
    metrics_.CountRequest(JobLabel(job), "PlanGroup", status.code(), absl::Now());
    call->FinishCall(status, response);
  };
  if (!status.ok()) {
    finish(status);
    return call->Returned();
  }
  auto checked =
      CheckPlanGroupRequest(*request, options_.limits, options_.balancer.limits, &worlds_);
  status = checked.status();
  if (status.ok()) status = rendezvous_.Touch(request->spec(), tenant, absl::Now());
  SyncCostFits();
  if (!status.ok()) {
    finish(status);
    return call->Returned();
  }
  const std::vector<double> speeds = NormalizedRankSpeeds(checked->rank_speeds);
  for (int r = 0; r < request->previous_size(); ++r) {
    if (request->previous(r).compute_seconds() > 0) {
      cost_fits_.AddTiming(request->spec(), r, request->previous(r),
                           speeds.empty() ? 1.0 : speeds[r]);
    }
  }
  int64_t sequences = 0;
  for (const v1::RankLengths& rank : request->ranks()) sequences += rank.sequence_lengths_size();
  auto shared_checked = std::make_shared<CheckedGroupRequest>(*std::move(checked));
  SolveNowOrSchedule(tenant, job, sequences, [this, context, request, response, finish,
                                      shared_checked](const absl::Status& admitted) {
    if (!admitted.ok()) {
      finish(admitted);
      return;
    }
    // A caller that gave up (cancelled, or past its deadline) while the step
    // waited for a solver gets no solve: its answer would go nowhere.
    if (context->IsCancelled()) {
      finish(absl::CancelledError(
          "PlanGroup: cancelled, or past its deadline, before a solver took the step"));
      return;
    }
    const v1::StepSpec& spec = request->spec();
    v1::Balance balance;
    absl::StatusOr<knapformer::Plan> plan =
        SolveAndRecord(spec, shared_checked->spec, std::move(shared_checked->input),
                       /*wait_seconds=*/-1, &balance, shared_checked->rank_speeds);
    if (!plan.ok()) {
      finish(plan.status());
      return;
    }
    response->set_job_id(spec.job_id());
    response->set_group_id(spec.group_id());
    response->set_step(spec.step());
    *response->mutable_balance() = balance;
    ChunksToProto(*plan, response->mutable_chunks());
    response->mutable_workload_before()->Add(plan->workload_before.begin(),
                                             plan->workload_before.end());
    response->mutable_workload_after()->Add(plan->workload_after.begin(),
                                            plan->workload_after.end());
    if (request->include_rank_plans()) {
      for (int32_t r = 0; r < plan->world_size; ++r) {
        RankPlanToProto(plan->Slice(r), response->add_rank_plans());
      }
    }
    chunk_tables_.GiveBack(std::move(plan->chunks));
    finish(absl::OkStatus());
  });
  return call->Returned();
}

grpc::ServerUnaryReactor* PlannerService::GetJob(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* wire,
                                                 grpc::ByteBuffer* wire_response) {
  auto* call = new GetJobCall(this, wire_response);
  const v1::GetJobRequest* request = call->messages.request();
  bool authorized = false;
  if (absl::Status admitted = Admit(*context, *wire, call, call->messages.request(), &authorized);
      !admitted.ok()) {
    metrics_.CountRequest(authorized ? JobLabel(request->job_id()) : "", "GetJob",
                          admitted.code(), absl::Now());
    call->FinishCall(admitted);
    return call->Returned();
  }
  auto answer = [this, call, request] {
    absl::StatusOr<v1::JobState> state = rendezvous_.GetJob(request->job_id(), absl::Now());
    if (state.ok()) *call->messages.response() = *std::move(state);
    metrics_.CountRequest(JobLabel(request->job_id()), "GetJob", state.status().code(),
                          absl::Now());
    call->FinishCall(state.status(), call->messages.response());
  };
  if (options_.answer_delay) {
    ScheduleAnswer(std::move(answer));
  } else {
    answer();  // cheap: on gRPC's thread
  }
  return call->Returned();
}

void PlannerService::ScheduleAnswer(std::function<void()> task) {
  const absl::Duration delay =
      options_.answer_delay ? options_.answer_delay() : absl::ZeroDuration();
  if (delay > absl::ZeroDuration()) {
    pool_.ScheduleAt(absl::Now() + delay, std::move(task));
  } else {
    pool_.Schedule(std::move(task));
  }
}

void PlannerService::SolveNowOrSchedule(const std::string& tenant, const std::string& job,
                                        int64_t sequences,
                                        std::function<void(const absl::Status&)> solve) {
  if (!options_.answer_delay && sequences <= options_.inline_solve_max_sequences) {
    solve(absl::OkStatus());
    return;
  }
  const int32_t limit = options_.limits.max_queued_solves;
  if (queued_solves_.fetch_add(1) >= limit) {
    queued_solves_.fetch_sub(1);
    solve(absl::ResourceExhaustedError(absl::StrCat(
        "max_queued_solves: ", limit, " steps already wait for a solver thread; retry later")));
    return;
  }
  const absl::Time ready = absl::Now();
  auto queued = [this, ready, solve = std::move(solve)] {
    queued_solves_.fetch_sub(1);
    const absl::Duration waited = absl::Now() - ready;
    const absl::Duration limit = options_.limits.max_solve_wait;
    if (waited > limit) {
      solve(absl::DeadlineExceededError(absl::StrCat(
          "max_solve_wait: the step waited ", absl::FormatDuration(waited),
          " for a solver thread, past the limit of ", absl::FormatDuration(limit),
          "; not solved (the planner is overloaded)")));
      return;
    }
    solve(absl::OkStatus());
  };
  // After the injected delay (if any) the step joins its job's queue; each
  // pool task then runs whichever step's turn it is.
  ScheduleAnswer([this, tenant, job, queued = std::move(queued)]() mutable {
    solve_queue_.Push(tenant, job, std::move(queued));
    pool_.Schedule([this] { SolveNextQueued(); });
  });
}

void PlannerService::SolveNextQueued() {
  // One pool task is scheduled per step pushed, after its push: never empty.
  if (std::function<void()> solve = solve_queue_.Pop()) solve();
}

void PlannerService::SyncCostFits() {
  absl::MutexLock lock(&lifetime_mu_);
  for (const LifetimeEvent& event : rendezvous_.TakeLifetimeEvents()) {
    switch (event.kind) {
      case LifetimeEvent::Kind::kGroupAdded:
        cost_fits_.AddGroup(event.job_id, event.group_id, event.incarnation);
        break;
      case LifetimeEvent::Kind::kGroupForgotten:
        cost_fits_.ForgetGroup(event.job_id, event.group_id, event.incarnation);
        break;
      case LifetimeEvent::Kind::kJobForgotten:
        cost_fits_.ForgetJob(event.job_id);
        break;
    }
  }
}

void PlannerService::CallArrived() {
  absl::MutexLock lock(&calls_mu_);
  ++unanswered_calls_;
}

void PlannerService::CallAnswered() {
  absl::MutexLock lock(&calls_mu_);
  --unanswered_calls_;
}

bool PlannerService::AllAnswered() const { return unanswered_calls_ == 0; }

bool PlannerService::WaitForAnswers(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  return calls_mu_.AwaitWithDeadline(absl::Condition(this, &PlannerService::AllAnswered),
                                     deadline);
}

void PlannerService::FinishCalls(const std::vector<PendingCall*>& calls,
                                 const absl::Status& status) {
  for (PendingCall* call : calls) static_cast<PlanCall*>(call)->FinishWith(status);
}

void PlannerService::Drain() {
  std::vector<PendingCall*> calls = rendezvous_.Close();
  if (!calls.empty()) {
    Log(LogLevel::kInfo,
        absl::StrCat("shutting down: failing ", calls.size(), " waiting calls with UNAVAILABLE"));
  }
  FinishCalls(calls,
              absl::UnavailableError("the planner is shutting down; retry against its replacement"));
}

void PlannerService::Reap() {
  absl::MutexLock lock(&reaper_mu_);
  while (!stop_reaper_) {
    const absl::Time now = absl::Now();
    const absl::Time wake = std::min(rendezvous_.NextDeadline(), now + kReapInterval);
    reaper_mu_.AwaitWithDeadline(absl::Condition(&stop_reaper_), wake);
    if (stop_reaper_) break;
    reaper_mu_.Unlock();
    const absl::Time after = absl::Now();
    for (FailedCalls& failed : rendezvous_.Expire(after)) {
      Log(LogLevel::kWarning, failed.status.ToString());
      metrics_.CountTimeout(failed.job_id, after);
      FinishCalls(failed.calls, failed.status);
    }
    for (const std::string& job : rendezvous_.DropIdleJobs(after)) {
      Log(LogLevel::kInfo, absl::StrCat("forgot job '", job,
                                        "' (idle past the job TTL, or the least recently "
                                        "active when a new job needed room)"));
    }
    SyncCostFits();
    metrics_.DropIdleJobs(after, options_.limits.job_ttl);
    // The key file and revocation list are looked at even without calls,
    // so that a broken one shows in the metrics and the log at once.
    if (options_.authorizer != nullptr) {
      if (std::optional<AuthFilesState> files = options_.authorizer->Refresh()) {
        metrics_.SetAuthFiles(*files);
      }
    }
    reaper_mu_.Lock();
  }
}

}  // namespace knapformer
