#include "client/planner_link.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/grpc_log.h"

namespace knapformer {
namespace {

std::shared_ptr<grpc::Channel> ChannelTo(const PlannerLinkOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // the link retries itself
  // A target naming several replicas (dns:/// of a headless Service,
  // ipv4:a:p,b:q) spreads group steps over the ready ones, and a step
  // refused or lost by one is retried on the next.
  args.SetLoadBalancingPolicyName(options.spread_over_replicas ? "round_robin" : "pick_first");
  // Replicas replaced by a rolling update are found again within a second
  // of a disconnect, not gRPC's default 30 s between DNS queries.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  if (options.spread_over_replicas) {
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
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // gRPC's "min reconnect backoff" is the time a connection attempt is
  // given to reach the service's first HTTP/2 frame, not a backoff. At
  // 200 ms, reconnections after the service's max connection age timed
  // out on a loaded machine and their steps were planned locally
  // (AServiceSlowToConnectToPlansEveryStepAcrossReconnections). gRPC's
  // default, 20 s: a call's own deadline still bounds its step.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  // A group's whole plan can exceed gRPC's default 4 MiB; a larger answer
  // than the options allow is refused before it is parsed.
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_answer_bytes));
  auto credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  RouteGrpcLogsToLog();
  return grpc::CreateCustomChannel(options.address, credentials, args);
}

// Every call's context carries the job token (none without one).
void Authorize(const PlannerLinkOptions& options, grpc::ClientContext* context) {
  if (!options.token.empty()) context->AddMetadata("authorization", "Bearer " + options.token);
}

}  // namespace

bool CancelToken::Enter(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  current_ = context;
  return true;
}

void CancelToken::Leave() {
  absl::MutexLock lock(&mu_);
  current_ = nullptr;
}

bool CancelToken::SleepFor(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), duration);
  return !cancelled_;
}

void CancelToken::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (current_ != nullptr) current_->TryCancel();
}

BackgroundCall::BackgroundCall(std::function<grpc::Status(CancelToken*)> body)
    : thread_([this, body = std::move(body)] { status_ = body(&token_); }) {}

BackgroundCall::~BackgroundCall() {
  token_.Cancel();
  if (thread_.joinable()) thread_.join();
}

grpc::Status BackgroundCall::Wait() {
  if (thread_.joinable()) thread_.join();
  return status_;
}

PlannerLink::PlannerLink(PlannerLinkOptions options)
    : options_(std::move(options)), stub_(v1::Planner::NewStub(ChannelTo(options_))) {}

PlannerLink::~PlannerLink() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (prober_.joinable()) prober_.join();
}

grpc::Status PlannerLink::Plan(const v1::PlanRequest& request, v1::PlanResponse* response,
                               CancelToken* token) {
  return CallWithRetries(
      token, [&](grpc::ClientContext* context) { return stub_->Plan(context, request, response); });
}

grpc::Status PlannerLink::PlanGroup(const v1::PlanGroupRequest& request,
                                    v1::PlanGroupResponse* response, CancelToken* token) {
  return CallWithRetries(token, [&](grpc::ClientContext* context) {
    return stub_->PlanGroup(context, request, response);
  });
}

grpc::Status PlannerLink::CallWithRetries(
    CancelToken* token, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "cancelled: the step moved on");
  absl::Duration backoff = options_.initial_backoff;
  // The attempts share the step's deadline: a retry on another replica
  // (round_robin picks the next ready one) takes what the first left.
  const absl::Time deadline = absl::Now() + options_.call_deadline;
  grpc::Status status;
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    Authorize(options_, &context);
    if (token != nullptr && !token->Enter(&context)) return cancelled;
    status = call(&context);
    if (token != nullptr) token->Leave();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt == options_.max_attempts) {
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
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  return status;
}

void PlannerLink::StartProbing(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  probed_job_ = job_id;
  probe_answered_ = false;
  probing_ = true;
  if (!prober_.joinable()) prober_ = std::thread([this] { ProbeLoop(); });
}

void PlannerLink::StopProbing() {
  absl::MutexLock lock(&mu_);
  probing_ = false;
}

bool PlannerLink::probe_answered() const {
  absl::MutexLock lock(&mu_);
  return probe_answered_;
}

bool PlannerLink::ProbingOrStopping() const { return probing_ || stopping_; }

void PlannerLink::ProbeLoop() {
  mu_.Lock();
  while (!stopping_) {
    if (!probing_) {
      mu_.Await(absl::Condition(this, &PlannerLink::ProbingOrStopping));
      continue;
    }
    v1::GetJobRequest request;
    request.set_job_id(probed_job_);
    mu_.Unlock();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.probe_deadline));
    Authorize(options_, &context);
    // Waits (within the deadline) for a connection instead of failing at
    // once while the channel backs off: a probe is what makes an idle
    // channel reconnect to a restarted service.
    context.set_wait_for_ready(true);
    v1::JobState state;
    const grpc::Status status = stub_->GetJob(&context, request, &state);
    const bool answered = status.error_code() != grpc::StatusCode::UNAVAILABLE &&
                          status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
    mu_.Lock();
    if (probing_) probe_answered_ = answered;
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.probe_interval);
  }
  mu_.Unlock();
}

}  // namespace knapformer
