#include "server/cost_fits.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

void CostFits::AddGroup(const std::string& job_id, const std::string& group_id,
                         uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  jobs_[job_id].groups.try_emplace(GroupKey(group_id, incarnation));
}

void CostFits::ForgetGroup(const std::string& job_id, const std::string& group_id,
                            uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) it->second.groups.erase(GroupKey(group_id, incarnation));
}

void CostFits::ForgetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

std::deque<CostFits::PlannedWork>* CostFits::FindGroup(const v1::StepSpec& spec, Job** job) {
  auto job_it = jobs_.find(spec.job_id());
  if (job_it == jobs_.end()) return nullptr;
  auto group_it = job_it->second.groups.find(GroupKey(spec.group_id(), spec.incarnation()));
  if (group_it == job_it->second.groups.end()) return nullptr;
  *job = &job_it->second;
  return &group_it->second;
}

void CostFits::RecordPlanned(const v1::StepSpec& spec, std::vector<WorkSample> rank_work,
                              std::vector<PairWeights> rank_weights,
                              const MeasuredAttention* prior) {
  absl::MutexLock lock(&mu_);
  Job* job = nullptr;
  std::deque<PlannedWork>* work = FindGroup(spec, &job);
  if (work == nullptr) return;
  if (prior != nullptr && !rank_weights.empty() &&
      (!job->prior.has_value() || job->prior->pairs() != prior->pairs() ||
       job->prior->work() != prior->work())) {
    job->prior = *prior;
    job->table_steps_changed = true;
  }
  if (!rank_work.empty() && limits_.timed_steps > 0) {
    const size_t ranks = rank_work.size();
    if (rank_weights.size() != ranks) rank_weights.clear();
    work->push_back({spec.step(), std::move(rank_work), std::vector<bool>(ranks, false),
                     std::move(rank_weights)});
    while (static_cast<int32_t>(work->size()) > limits_.timed_steps) work->pop_front();
  }
  Refit(*job);  // once per step, so the exported gamma keeps up
}

void CostFits::AddTiming(const v1::StepSpec& spec, int32_t rank, const v1::StepTiming& timing,
                         double speed) {
  absl::MutexLock lock(&mu_);
  Job* job = nullptr;
  std::deque<PlannedWork>* work = FindGroup(spec, &job);
  if (work == nullptr) return;
  job->timed = true;
  // The most recent plan of that step number (a restarted job plans its
  // numbers again).
  PlannedWork* planned = nullptr;
  for (auto it = work->rbegin(); it != work->rend(); ++it) {
    if (it->step == timing.step()) {
      planned = &*it;
      break;
    }
  }
  const bool carried = timing.linear_work() > 0 || timing.attention_work() > 0;
  if (planned == nullptr) {
    // Planned elsewhere (another replica, or locally by the client): the
    // timing brings its work. Recorded as a step so that a retried
    // request does not count twice.
    if (!carried || limits_.timed_steps <= 0 || spec.world_size() <= 0) return;
    work->push_back({timing.step(), {}, std::vector<bool>(spec.world_size(), false), {}});
    while (static_cast<int32_t>(work->size()) > limits_.timed_steps) work->pop_front();
    planned = &work->back();
  }
  if (rank < 0 || rank >= static_cast<int32_t>(planned->timed.size()) || planned->timed[rank]) {
    return;
  }
  // The carried work is that of the plan the ranks ran; this server's own
  // plan of the step may have gone unused (answered after the client's
  // deadline, or after its retry on another replica).
  WorkSample sample;
  if (carried) {
    sample.linear = timing.linear_work();
    sample.attention = timing.attention_work();
  } else if (rank < static_cast<int32_t>(planned->rank_work.size())) {
    sample = planned->rank_work[rank];
  } else {
    return;
  }
  planned->timed[rank] = true;
  // As a GPU at speed 1 would have timed it (SpeedLearner::AtUnitSpeed).
  sample.seconds = timing.compute_seconds() * speed;
  // A sample of the table needs the rank's attention by grid point in the
  // plan it ran: carried with the work (group mode: any replica), else
  // this server's plan's, when the rank ran it (the work it carries, if
  // any, is this plan's).
  const auto& carried_weights = timing.attention_by_pair_point();
  std::optional<PairWeights> weights;
  if (carried && carried_weights.size() == kPairGridPoints) {
    weights.emplace();
    std::copy(carried_weights.begin(), carried_weights.end(), weights->begin());
  } else if (rank < static_cast<int32_t>(planned->rank_weights.size())) {
    const WorkSample& own = planned->rank_work[rank];
    if (!carried || (own.linear == sample.linear && own.attention == sample.attention)) {
      weights = planned->rank_weights[rank];
    }
  }
  if (weights.has_value()) {
    job->table_steps.push_back({sample, *weights});
    while (job->table_steps.size() > static_cast<size_t>(kTableWindow)) {
      job->table_steps.pop_front();
    }
    job->table_steps_changed = true;
  }
  std::deque<WorkSample>& timings = job->timings;
  timings.push_back(sample);
  while (static_cast<int32_t>(timings.size()) > limits_.timing_window) timings.pop_front();
  job->timings_changed = true;
}

bool CostFits::WantsWork(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second.timed;
}

void CostFits::Refit(Job& job) const {
  if (!job.timings_changed) return;
  job.timings_changed = false;
  if (static_cast<int32_t>(job.timings.size()) < limits_.min_timing_samples) {
    job.fit_note = absl::StrCat(job.timings.size(), " timing samples, the fit needs ",
                                limits_.min_timing_samples,
                                " (every rank's record_compute_seconds, one per step)");
    return;
  }
  absl::StatusOr<CostFit> fit =
      FitCostModel(std::vector<WorkSample>(job.timings.begin(), job.timings.end()));
  if (fit.ok()) {
    job.fit = *fit;
    job.fit_note.clear();
  } else {
    job.fit_note = absl::StrCat("the fit of ", job.timings.size(),
                                " timing samples failed: ", fit.status().message(),
                                job.fit.has_value() ? " (the previous fit is used)" : "");
  }
}

void CostFits::RefitTable(Job& job) const {
  if (!job.table_steps_changed) return;
  if (!job.fit.has_value()) {
    job.table_note = absl::StrCat("no gamma fit yet, whose k the table needs: ", job.fit_note);
    return;  // its samples stay new until there is a k
  }
  job.table_steps_changed = false;
  absl::StatusOr<MeasuredAttention> table = FitMeasuredAttentionFromSteps(
      std::vector<StepSample>(job.table_steps.begin(), job.table_steps.end()), job.fit->k,
      job.prior.has_value() ? &*job.prior : nullptr);
  if (table.ok()) {
    job.table = *std::move(table);
    job.table_note.clear();
  } else {
    job.table_note = absl::StrCat("the table's fit of ", job.table_steps.size(),
                                  " timings failed: ", table.status().message(),
                                  job.table.has_value() ? " (the previous table is used)" : "");
  }
}

std::optional<MeasuredAttention> CostFits::FittedTable(const std::string& job_id,
                                                        std::string* note) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.table_steps.empty()) {
    if (note != nullptr) {
      *note = "no timed steps of this job for its table yet (record_compute_seconds on every "
              "rank)";
    }
    return std::nullopt;
  }
  Refit(it->second);
  RefitTable(it->second);
  if (note != nullptr) *note = it->second.table_note;
  return it->second.table;
}

std::optional<CostFit> CostFits::FittedCost(const std::string& job_id, std::string* note) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    if (note != nullptr) *note = "no timings of this job yet";
    return std::nullopt;
  }
  Refit(it->second);
  if (note != nullptr) {
    *note = it->second.fit_note.empty() && !it->second.fit.has_value()
                ? "no timings of this job yet (record_compute_seconds on every rank)"
                : it->second.fit_note;
  }
  return it->second.fit;
}

std::map<std::string, double> CostFits::FittedGammas() const {
  std::map<std::string, double> gammas;
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, job] : jobs_) {
    if (job.fit.has_value()) gammas.emplace_hint(gammas.end(), job_id, job.fit->gamma);
  }
  return gammas;
}

CostFits::Usage CostFits::usage() const {
  Usage usage;
  absl::MutexLock lock(&mu_);
  usage.jobs = static_cast<int32_t>(jobs_.size());
  for (const auto& [job_id, job] : jobs_) {
    usage.groups += static_cast<int64_t>(job.groups.size());
    for (const auto& [key, work] : job.groups) {
      usage.planned_steps += static_cast<int64_t>(work.size());
    }
    usage.samples += static_cast<int64_t>(job.timings.size() + job.table_steps.size());
  }
  return usage;
}

}  // namespace knapformer
