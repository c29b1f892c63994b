#ifndef KNAPFORMER_SERVER_COST_FITS_H_
#define KNAPFORMER_SERVER_COST_FITS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/calibration.h"
#include "planner/measured_cost.h"
#include "planner/measured_fit.h"
#include "server/service_limits.h"

namespace knapformer {

// The online fits of every job's cost model (named for what it fits: gamma,
// and a measured job's attention table): the ranks' measured compute times
// of their steps (PlanRequest.previous), each paired with the work that
// step's plan gave the rank, and the cost model FitCostModel fits to them.
//
// It keeps state only for the jobs and group incarnations added and not yet
// forgotten. Its owner adds and forgets them as the rendezvous starts and
// stops remembering them (Rendezvous::TakeLifetimeEvents), so a job's timings
// and fit live exactly as long as the rendezvous remembers the job, and a
// group's planned work as long as it remembers that incarnation of the group.
//
// A job whose steps are planned with the measured cost model under
// use_fitted_gamma also gets a fitted attention table (FittedTable): its
// steps keep each rank's attention by grid point (planner/measured_fit.h)
// beside its work, and timed, those become samples of the table's fit.
//
// Memory is bounded by the limits: per job, the last timing_window samples
// and one fit, and for a table's job the last kTableWindow step samples
// (152 bytes each) and one table; per group incarnation, the work of the
// last timed_steps steps (O(ranks) each, a plan's or a timing's; 128 bytes
// more per rank for a table's job). Thread-safe; no method blocks on
// anything but its own mutex.
class CostFits {
 public:
  // The step samples a job's table is fitted from (the most recent).
  static constexpr int32_t kTableWindow = 1024;

  explicit CostFits(ServiceLimits limits) : limits_(limits) {}

  // Starts keeping the group incarnation, and its job if new; a no-op if kept.
  void AddGroup(const std::string& job_id, const std::string& group_id, uint64_t incarnation);
  // Forgets the group incarnation's planned work; its job's timings and fit stay.
  void ForgetGroup(const std::string& job_id, const std::string& group_id, uint64_t incarnation);
  // Forgets the job: its timings, its fit, and the planned work of its groups.
  void ForgetJob(const std::string& job_id);

  // Records a solved step's work in its group's state (no-op if the group
  // was not added, or was forgotten): the work its plan gives each rank (for
  // the gamma fit; may be empty) and, for the table's fit, each rank's
  // attention by grid point (empty but for a job that fits one). Refits the
  // job's gamma if new timings came (once per step, so the exported gamma
  // keeps up).
  // `prior` (with rank_weights): the table the step's spec gave, which the
  // table's fit keeps where the steps cannot tell.
  void RecordPlanned(const v1::StepSpec& spec, std::vector<WorkSample> rank_work,
                     std::vector<PairWeights> rank_weights = {},
                     const MeasuredAttention* prior = nullptr);

  // Pairs a rank's measured compute time of an earlier step with the work
  // that step's plan gave it, as a sample of its job's gamma fit: the work
  // the timing carries (StepTiming.linear_work/attention_work: that of the
  // plan the ranks ran, wherever it was made), else that of this server's
  // plan of the step. Ignored when neither is known (the step is too old,
  // or was planned elsewhere and the timing carries no work), and when the
  // rank already sent a timing for that step (a retried request). Ignored
  // too, and the job not marked as timed, for a group not added.
  // It is a sample of the job's table too when the timing carries the
  // rank's attention by grid point with its work, or when this server's
  // plan of the step kept it and is the plan the rank ran (no carried
  // work, or this plan's). `speed`: the rank's relative speed, normalized
  // (PlanGroupRequest.rank_speeds); its seconds are taken times it, as a
  // GPU at speed 1 would have timed the step, so that a slow rank does not
  // bias the fit.
  void AddTiming(const v1::StepSpec& spec, int32_t rank, const v1::StepTiming& timing,
                 double speed = 1.0);

  // Whether the job's ranks send timings (so its steps' work is worth keeping).
  bool WantsWork(const std::string& job_id) const;

  // The job's fit from its timing samples, refitted when new samples came;
  // nullopt until a refit succeeds. A refit that fails (say, a window of one
  // sequence length, which cannot tell the two terms apart) keeps the last
  // good fit: the hardware did not change, the data just stopped showing it.
  // `note` (optional): why there is no fit, or why the last refit failed
  // (then the previous fit, if any, is returned); empty when the fit is new.
  std::optional<CostFit> FittedCost(const std::string& job_id, std::string* note = nullptr);

  // The job's attention table fitted from its timed steps with the k of its
  // fit (FitMeasuredAttentionFromSteps), refitted when new samples came;
  // nullopt until one succeeds, and the last good table after a failed
  // refit. `note` (optional): why there is none, or why the last refit
  // failed; empty when the table is new.
  std::optional<MeasuredAttention> FittedTable(const std::string& job_id,
                                               std::string* note = nullptr);

  // The gamma of every job that has a fit, by job id, as last refitted (no
  // refit here): the metrics' knapformer_planner_fitted_gamma.
  std::map<std::string, double> FittedGammas() const;

  // What is kept, to check the bounds: jobs, group incarnations, planned
  // steps (over all groups) and timing and table samples (over all jobs).
  struct Usage {
    int32_t jobs = 0;
    int64_t groups = 0;
    int64_t planned_steps = 0;
    int64_t samples = 0;
  };
  Usage usage() const;

 private:
  // One of a group's last timed_steps planned steps, with the work its plan
  // gave each rank (empty when planned elsewhere: a timing carried the work)
  // and which ranks have already sent their timing for it (a retried request
  // must not count twice).
  struct PlannedWork {
    uint64_t step = 0;
    std::vector<WorkSample> rank_work;
    std::vector<bool> timed;
    std::vector<PairWeights> rank_weights;  // a table's job's plans only
  };
  // A group of one incarnation of its job (StepSpec.incarnation).
  using GroupKey = std::pair<std::string, uint64_t>;
  struct Job {
    // Each kept group incarnation's planned steps, the most recent last.
    std::map<GroupKey, std::deque<PlannedWork>> groups;
    bool timed = false;              // a rank has sent a timing
    std::deque<WorkSample> timings;  // the last timing_window samples
    bool timings_changed = false;
    std::optional<CostFit> fit;
    std::string fit_note;  // why the last refit did not give `fit` (or empty)
    std::deque<StepSample> table_steps;  // the last kTableWindow
    bool table_steps_changed = false;
    std::optional<MeasuredAttention> prior;  // the last spec's table
    std::optional<MeasuredAttention> table;
    std::string table_note;  // why the last refit did not give `table` (or empty)
  };

  // The planned work of `spec`'s group, with its job in *job; null if the
  // group is not kept.
  std::deque<PlannedWork>* FindGroup(const v1::StepSpec& spec, Job** job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refits the job's gamma if new timings came (O(timing_window)); keeps the
  // previous fit when the refit fails.
  void Refit(Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refits the job's table if new step samples came, with its fit's k;
  // keeps the previous table when the refit fails.
  void RefitTable(Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServiceLimits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_COST_FITS_H_
