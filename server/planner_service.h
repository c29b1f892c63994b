#ifndef KNAPFORMER_SERVER_PLANNER_SERVICE_H_
#define KNAPFORMER_SERVER_PLANNER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balancer.h"
#include "planner/chunk_table_cache.h"
#include "server/fair_queue.h"
#include "server/cost_fits.h"
#include "server/job_auth.h"
#include "server/rendezvous.h"
#include "server/request_check.h"
#include "server/request_scan.h"
#include "server/service_limits.h"
#include "server/service_metrics.h"
#include "server/tenant_quota.h"
#include "server/thread_pool.h"

namespace knapformer {

struct ServiceOptions {
  ServiceLimits limits;
  BalancerOptions balancer;
  // Threads that solve steps and build the answers; 0 = one per CPU this
  // process may use (AvailableCpus: its affinity and its cgroup's quota, not
  // the node's cores).
  int solver_threads = 0;
  // A step of at most this many sequences (over all ranks) is solved and
  // answered on the gRPC thread that completed it: handing it to the pool
  // costs ~1 ms of CPU per step on a 2-core machine (a wake-up, and one
  // write per answer instead of one per connection), 30 times the solve at
  // 32 ranks. Larger steps go to the pool, so that a long solve never holds
  // one of gRPC's threads. 0 = always the pool.
  int64_t inline_solve_max_sequences = 4096;
  // Fault injection for tests (`serve --answer-delay-file`): asked once per
  // Plan step, PlanGroup and GetJob call; the answer is held back that long
  // (on a timer: no thread sleeps). Null = no delay.
  std::function<absl::Duration()> answer_delay;
  // The metrics page's per-group gauges are a snapshot made at most this
  // often (a scrape never holds the rendezvous' lock more often).
  absl::Duration metrics_gauge_interval = absl::Seconds(1);
  // Who may act as which job, and for which tenant (job_auth.h); null =
  // anyone, each job its own tenant (`--auth=none`). Asked first by every
  // call that names a job.
  std::shared_ptr<JobAuthorizer> authorizer;
};

// Every method takes its request as bytes (gRPC's raw callback methods):
// each is scanned, authorized, checked against the limits and charged to
// the request-memory quota before it is parsed (request_scan.h).
using PlannerServiceBase = v1::Planner::WithRawCallbackMethod_Plan<
    v1::Planner::WithRawCallbackMethod_PlanGroup<
        v1::Planner::WithRawCallbackMethod_GetJob<v1::Planner::Service>>>;

// The knapformer.v1.Planner service on gRPC's callback API: a rank waiting in
// a rendezvous holds no thread. Small steps are solved and answered on the
// gRPC thread that completed them, larger ones on the service's own thread
// pool; a background thread expires rendezvous and idle jobs. The gamma fits
// live beside the rendezvous, under a lock of their own, and keep each job
// and group incarnation exactly as long as it does (SyncCostFits).
// Thread-safe. Must outlive the grpc::Server it is registered with.
class PlannerService final : public PlannerServiceBase {
 public:
  explicit PlannerService(const ServiceOptions& options);
  ~PlannerService() override;

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PlanGroup(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

  // Fails every waiting rank with UNAVAILABLE and refuses later requests.
  // Steps already being solved are still answered.
  void Drain();

  // Waits until every Plan, PlanGroup and GetJob call is done (answered and
  // its answer sent, or cancelled: gRPC's OnDone), or until `deadline`;
  // true when none is left. After Drain() no new step waits in a
  // rendezvous, so this ends once the steps being solved are answered.
  bool WaitForAnswers(absl::Time deadline);

  ServiceMetrics& metrics() { return metrics_; }
  const Rendezvous& rendezvous() const { return rendezvous_; }
  const CostFits& cost_fits() const { return cost_fits_; }
  const ChunkTableCache& chunk_tables() const { return chunk_tables_; }
  // Its fits are refitted as they are read (FittedCost, FittedTable).
  CostFits& cost_fits() { return cost_fits_; }
  // Bytes of requests held (estimated before parsing), in all, by tenant and
  // by job.
  const TenantQuota& request_memory() const { return request_memory_; }
  const TenantQuota& plan_group_calls() const { return plan_group_calls_; }

 private:
  class PlanCall;
  class PlanGroupCall;
  class GetJobCall;
  class CountedReactor;

  // Reads a raw call's request into `request`: scans it, authorizes the job
  // it names (giving the reactor its tenant; *authorized: whether it did,
  // so the call may be counted under that job), checks it against the
  // limits, charges its estimated memory to `reactor` and parses it.
  // Nothing is parsed unless all passed. Request: v1::PlanRequest,
  // v1::PlanGroupRequest or v1::GetJobRequest.
  template <typename Request>
  absl::Status Admit(const grpc::CallbackServerContext& context, const grpc::ByteBuffer& wire,
                     CountedReactor* reactor, Request* request, bool* authorized);

  // options_.authorizer's tenant for `context` acting as `job_id`.
  absl::StatusOr<std::string> Authorize(const grpc::CallbackServerContext& context,
                                        const std::string& job_id);

  // Solves one step and records it in the job's state and metrics
  // (wait_seconds < 0: no rendezvous, e.g. PlanGroup); *balance on success.
  // `rank_speeds` (checked; empty: one speed) plan by time.
  absl::StatusOr<knapformer::Plan> SolveAndRecord(const v1::StepSpec& spec,
                                                  const CheckedSpec& checked,
                                                  BalancerInput&& input,
                                                  double wait_seconds, v1::Balance* balance,
                                                  const std::vector<double>& rank_speeds = {});
  void SolveAndAnswer(std::shared_ptr<ReadyStep> step);
  // Answers each of `calls` (Plan calls the rendezvous handed back) with
  // `status`.
  static void FinishCalls(const std::vector<PendingCall*>& calls, const absl::Status& status);
  void AnswerRange(std::shared_ptr<const knapformer::Plan> plan,
                   std::shared_ptr<ReadyStep> step, std::shared_ptr<const v1::Balance> balance,
                   size_t begin, size_t end);
  void Reap();
  // Runs `task` on the pool after options_.answer_delay (at once without one).
  void ScheduleAnswer(std::function<void()> task);
  // Runs `solve` exactly once, with OK when it may solve, for a step of
  // `job` of `tenant` of `sequences` sequences: now, on this thread, when
  // the step is small enough (options_.inline_solve_max_sequences) and no
  // answer delay is injected; else after the delay, on a solver thread, the
  // tenant's and job's turn come (solve_queue_). With an error instead, and
  // nothing to solve: at once, RESOURCE_EXHAUSTED, when
  // limits.max_queued_solves steps already wait; DEADLINE_EXCEEDED when the
  // step waited past limits.max_solve_wait.
  void SolveNowOrSchedule(const std::string& tenant, const std::string& job, int64_t sequences,
                          std::function<void(const absl::Status&)> solve);
  // Runs the next step of solve_queue_ (one pool task per queued step).
  void SolveNextQueued();
  // Adds to and forgets from the gamma fits what the rendezvous added and
  // forgot (its lifetime log), in its order. Called after every Arrive,
  // Touch and DropIdleJobs, before the caller touches the fits: when it
  // returns, that call's changes and every earlier one are applied (a call
  // that finds the log empty still waits for one applying what it took).
  void SyncCostFits();

  // Counts a call from its arrival until gRPC is done with it (WaitForAnswers).
  void CallArrived();
  void CallAnswered();
  bool AllAnswered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_);

  const ServiceOptions options_;
  const RequestScanner scanner_;
  WorldCache worlds_;
  // Before pool_: its threads may still finish calls while it is joined.
  absl::Mutex calls_mu_;
  int64_t unanswered_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;
  Rendezvous rendezvous_;
  // Held while the rendezvous' lifetime log is taken and applied to the
  // fits, so that logs taken by two threads are applied in the order taken;
  // never while calling anything but those two.
  absl::Mutex lifetime_mu_;
  CostFits cost_fits_;
  ServiceMetrics metrics_;
  std::atomic<int32_t> queued_solves_{0};
  // PlanGroup calls in flight (checked, queued or being solved).
  TenantQuota plan_group_calls_;
  // Estimated bytes of the requests of calls gRPC is not done with.
  TenantQuota request_memory_;
  // Steps waiting for a solver thread, taken round-robin between tenants,
  // then between a tenant's jobs.
  FairQueue solve_queue_;
  // The last answered plan's chunk table, for the next plan to fill (its
  // pages stay mapped: chunk_table_cache.h). Before pool_: answers on its
  // threads give tables back while it is joined.
  ChunkTableCache chunk_tables_;
  ThreadPool pool_;

  absl::Mutex reaper_mu_;
  bool stop_reaper_ ABSL_GUARDED_BY(reaper_mu_) = false;
  std::thread reaper_;
};

// absl::Status -> grpc::Status, code for code (the two enums share values).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_PLANNER_SERVICE_H_
