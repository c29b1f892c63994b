#ifndef KNAPFORMER_SERVER_RENDEZVOUS_H_
#define KNAPFORMER_SERVER_RENDEZVOUS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knapformer/v1/planner.pb.h"
#include "server/request_check.h"
#include "server/service_limits.h"

namespace knapformer {

// One rank's Plan call waiting for the rest of its group. The rendezvous never
// answers a call itself: it hands calls back to its caller (ready, failed,
// left or drained), each exactly once.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  virtual const v1::PlanRequest& request() const = 0;
  // The tenant the caller acts for (job_auth.h): a job it creates is that
  // tenant's.
  virtual const std::string& tenant() const = 0;
};

// A step whose every rank has asked: the caller solves it and answers all.
struct ReadyStep {
  v1::StepSpec spec;  // the first arrival's
  std::string tenant;  // the job's
  CheckedSpec checked;
  std::vector<PendingCall*> calls;  // calls[rank]
  absl::Time first_arrival;
  absl::Time last_arrival;
  int64_t sequences = 0;  // over every rank
};

// Calls to answer with one error.
struct FailedCalls {
  std::string job_id;
  std::vector<PendingCall*> calls;
  absl::Status status;
};

// Snapshot of one group for metrics.
struct GroupGauges {
  std::string job_id;
  std::string group_id;
  int32_t pending_steps = 0;
  int32_t ranks_seen = 0;
  bool has_balance = false;
  v1::Balance last_balance;
};

// A change in which jobs and group incarnations the rendezvous remembers, for
// state kept beside it for exactly as long (the gamma fits).
struct LifetimeEvent {
  enum class Kind {
    kGroupAdded,      // a group incarnation, and its job if the job was new
    kGroupForgotten,  // a group incarnation (a newer one replaced it, or refused)
    kJobForgotten,    // a job and its groups (idle, evicted, or refused)
  };
  Kind kind = Kind::kGroupAdded;
  std::string job_id;
  std::string group_id;  // "" for kJobForgotten
  uint64_t incarnation = 0;
};

// The rendezvous of every (job, group, step), and what the server remembers
// about each job. Thread-safe; no method blocks on anything but its mutex,
// and none calls back into a PendingCall except request().
//
// Every job belongs to the tenant whose caller created it (job_auth.h): a
// tenant holds at most max_jobs_per_tenant jobs, and room is made for a new
// job from its own tenant's idle jobs before any other's.
//
// Memory is bounded by the limits: at most max_pending_steps steps hold calls
// (O(ranks) each), at most max_jobs jobs of max_groups_per_job groups are
// remembered (each a ring of remembered_steps step numbers and a bitmap of the
// ranks seen), and jobs idle longer than job_ttl are dropped by DropIdleJobs;
// plus the log of lifetime events not yet taken (TakeLifetimeEvents) and the
// last max_pending_steps withdrawn steps (Withdraw).
class Rendezvous {
 public:
  explicit Rendezvous(ServiceLimits limits) : limits_(limits) {}

  struct Arrival {
    // Not OK: the call was not added; answer it with this status.
    absl::Status status;
    // Set when this call completed its step: the step left the rendezvous.
    std::unique_ptr<ReadyStep> ready;
    // A step another job gave up to make room for this one (see Arrive):
    // answer its calls with the status. Set even when `status` is not OK.
    std::vector<FailedCalls> evicted;
  };

  // Adds `call`, whose request passed CheckPlanRequest (giving `checked`).
  // At max_pending_steps, a new step is opened by taking the oldest pending
  // step of the tenant holding the most (of its job holding the most), if
  // it holds at least two more than this call's tenant: a flood from a few
  // tenants, under however many job ids, cannot keep the others' steps out.
  // Errors: AlreadyExists (rank seen for this step, or the step was answered),
  // FailedPrecondition (spec differs from the step's first request),
  // ResourceExhausted (pending steps, jobs, groups or sequences per step),
  // Unavailable (after Close).
  Arrival Arrive(PendingCall* call, CheckedSpec checked, absl::Time now);

  // Takes `call` out of its step if it is still waiting there (the caller then
  // answers it, e.g. CANCELLED); false if it was already handed back.
  bool Leave(PendingCall* call);

  // Rank `rank` of `spec`'s step sent a request refused for its own input
  // (`refusal`: CheckRankInput's; its spec and rank passed, giving
  // `checked`): the step can never complete. Rather than every other rank
  // waiting out the rendezvous timeout, the step is withdrawn: the calls
  // waiting in it are handed back to answer with Aborted naming the rank
  // and the refusal, and ranks that ask for it later get that at once (the
  // server's last max_pending_steps withdrawn steps are remembered). The
  // refused rank may be the step's first; a withdrawal makes no job or
  // group (refused requests never hold one). Nothing is withdrawn for a
  // request whose spec differs from the waiting step's, for a rank already
  // waiting in it, or for a step already answered (nullopt then; else the
  // calls to answer, perhaps none, and their status).
  std::optional<FailedCalls> Withdraw(const v1::StepSpec& spec, const CheckedSpec& checked,
                                      int32_t rank, const absl::Status& refusal, absl::Time now);

  // Takes out every step whose rendezvous timeout has passed at `now`, with a
  // DeadlineExceeded status naming the missing ranks.
  std::vector<FailedCalls> Expire(absl::Time now);

  // When the next pending step expires; InfiniteFuture if none is pending.
  absl::Time NextDeadline() const;

  // Takes out every pending call; later arrivals get Unavailable.
  std::vector<PendingCall*> Close();
  bool closed() const;

  // Creates the job (as `tenant`'s) and group if needed, for a PlanGroup
  // request (which has no rendezvous). ResourceExhausted past max_jobs or
  // max_jobs_per_tenant when no job may make room (see FindOrCreateGroup),
  // or past max_groups_per_job.
  absl::Status Touch(const v1::StepSpec& spec, const std::string& tenant, absl::Time now);

  // Records a solved step in its group's state (no-op if the job was
  // dropped).
  void RecordPlanned(const v1::StepSpec& spec, const std::string& topology,
                     const v1::Balance& balance, absl::Time now);

  // Forgets jobs without pending steps and idle for job_ttl; returns their
  // ids, and those of the jobs evicted since the last call (see
  // FindOrCreateGroup).
  std::vector<std::string> DropIdleJobs(absl::Time now);
  // Jobs evicted to make room for new ones, since the start.
  int64_t jobs_evicted() const;
  // Groups forgotten because a new incarnation of them arrived, since the start.
  int64_t groups_replaced() const;
  // Pending steps failed to make room for another job's, since the start.
  int64_t steps_evicted() const;

  // Every group incarnation added and every group and job forgotten since
  // the last call, in the order the rendezvous made the changes, so that
  // state kept beside it can be added and forgotten in step. Arrive, Touch
  // and DropIdleJobs log them. The log grows by an event or two per group
  // incarnation created until taken: whoever keeps such state takes it after
  // each Arrive, Touch and DropIdleJobs, applying what it took before
  // another caller takes more (and before using that state).
  std::vector<LifetimeEvent> TakeLifetimeEvents();

  // NotFound for an unknown job.
  absl::StatusOr<v1::JobState> GetJob(const std::string& job_id, absl::Time now) const;

  std::vector<GroupGauges> Gauges() const;
  // How many times Gauges() has run (what a scrape costs the rendezvous).
  int64_t gauge_reads() const { return gauge_reads_.load(std::memory_order_relaxed); }
  int32_t pending_steps() const;
  int32_t jobs() const;

 private:
  struct Step {
    v1::StepSpec spec;  // of the first arrival
    CheckedSpec checked;  // of the first arrival
    absl::Time first_arrival;
    std::vector<bool> arrived;        // by rank
    std::vector<PendingCall*> calls;  // arrival order
    int64_t sequences = 0;
    int64_t mask_spans = 0;
  };
  using PendingSteps = std::map<uint64_t, std::unique_ptr<Step>>;  // by step number
  struct Group {
    PendingSteps pending;
    absl::Time last_activity;
    std::deque<uint64_t> answered;  // most recent last
    std::vector<bool> seen;         // ranks that have sent a Plan request
    int32_t ranks_seen = 0;
    uint64_t steps_planned = 0;
    uint64_t last_step = 0;
    int32_t world_size = 0;
    std::string topology;
    bool has_balance = false;
    v1::Balance last_balance;
  };
  // A group of one incarnation of its job (StepSpec.incarnation).
  using GroupKey = std::pair<std::string, uint64_t>;
  // A step of a group: job, group, incarnation, step.
  using StepKey = std::tuple<std::string, std::string, uint64_t, uint64_t>;
  static StepKey KeyOf(const v1::StepSpec& spec);
  struct Job {
    std::string tenant;
    std::map<GroupKey, Group> groups;
    absl::Time last_activity;
    int32_t pending = 0;
    bool planned = false;  // a step of it was solved
  };

  // Where a (job, group) lives; both null if it does not exist.
  struct Place {
    Job* job = nullptr;
    Group* group = nullptr;
  };
  Place FindGroup(const v1::StepSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds or creates the job (as `tenant`'s) and group of `spec`; *created
  // tells whether this call created the group (and maybe its job). Creating
  // a group forgets the job's other incarnations of it that have nothing
  // pending: a restarted run replaces the run it restarts. A new job at
  // max_jobs, or at its tenant's max_jobs_per_tenant, takes the room of an
  // idle job (nothing pending, and never planned or idle past the
  // rendezvous timeout: a job training is never evicted): its own tenant's
  // first, else, within its tenant's limit, one of a tenant holding more
  // jobs than its own does; ResourceExhausted when there is none.
  absl::StatusOr<Place> FindOrCreateGroup(const v1::StepSpec& spec, const std::string& tenant,
                                          absl::Time now, bool* created = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job to evict for a new job of `tenant` (jobs_.end(): none), given
  // every tenant's count of jobs and whether `tenant` is at its limit.
  std::map<std::string, Job>::iterator EvictionVictim(
      const std::string& tenant, const std::map<std::string, int32_t>& jobs_by_tenant,
      bool tenant_full, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Undoes a creation by FindOrCreateGroup for a refused request, so refused
  // requests never hold a job or group.
  void ForgetIfEmpty(const v1::StepSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At max_pending_steps: fails the oldest pending step of the tenant
  // holding the most (of its job holding the most; into *evicted) if it holds
  // at least two more than `job`'s tenant; false when no tenant does.
  bool MakeRoomFor(const Job& job, const v1::StepSpec& spec, std::vector<FailedCalls>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes pending step `it` out of `group` of `job`, keeping the pending
  // counts; returns the next pending step of the group.
  PendingSteps::iterator ErasePending(Job& job, Group& group, PendingSteps::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Arrive's work, under the lock.
  Arrival ArriveLocked(PendingCall* call, CheckedSpec checked, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends to the lifetime log (TakeLifetimeEvents).
  void LogLifetime(LifetimeEvent::Kind kind, const std::string& job_id,
                   const GroupKey& group = GroupKey()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServiceLimits limits_;
  mutable absl::Mutex mu_;
  mutable std::atomic<int64_t> gauge_reads_{0};
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  int32_t pending_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t groups_replaced_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_evicted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> evicted_ ABSL_GUARDED_BY(mu_);  // since DropIdleJobs
  int64_t jobs_evicted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<LifetimeEvent> lifetime_ ABSL_GUARDED_BY(mu_);  // since TakeLifetimeEvents
  // Withdrawn steps and what their ranks are answered; the order they were
  // withdrawn in, for forgetting the oldest past max_pending_steps.
  std::map<StepKey, absl::Status> withdrawn_ ABSL_GUARDED_BY(mu_);
  std::deque<StepKey> withdrawn_order_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_RENDEZVOUS_H_
