#include "server/rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "proto/plan_proto.h"
#include "common/rank_ranges.h"

namespace knapformer {
namespace {

std::string StepName(const v1::StepSpec& spec) {
  return absl::StrCat("step ", spec.step(), " of job '", spec.job_id(), "' group '",
                      spec.group_id(), "'",
                      spec.incarnation() != 0
                          ? absl::StrCat(" incarnation ", absl::Hex(spec.incarnation()))
                          : std::string());
}

// Whether `step` is among a group's remembered answered steps.
bool WasAnswered(const std::deque<uint64_t>& answered, uint64_t step) {
  return std::find(answered.begin(), answered.end(), step) != answered.end();
}

// FailedPrecondition naming the first field where `spec` (checked as
// `checked`) differs from the step's first request, or OK.
absl::Status CompareSpecs(const v1::StepSpec& first, const CheckedSpec& first_checked,
                          const v1::StepSpec& spec, const CheckedSpec& checked, int32_t rank) {
  const std::string& first_topology = first_checked.topology;
  const std::string& topology = checked.topology;
  auto mismatch = [&](const char* field, const auto& got, const auto& want) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.", field, ": rank ", rank, " sent ", got, " but ", StepName(first),
                     " was opened with ", want, "; every rank of a step must agree"));
  };
  if (spec.world_size() != first.world_size()) {
    return mismatch("world_size", spec.world_size(), first.world_size());
  }
  if (topology != first_topology) {
    return mismatch("topology", absl::StrCat("\"", topology, "\""),
                    absl::StrCat("\"", first_topology, "\""));
  }
  if (spec.d_model() != first.d_model()) {
    return mismatch("d_model", spec.d_model(), first.d_model());
  }
  if (spec.gamma() != first.gamma()) {
    return mismatch("gamma", spec.gamma(), first.gamma());
  }
  if (spec.use_fitted_gamma() != first.use_fitted_gamma()) {
    return mismatch("use_fitted_gamma", spec.use_fitted_gamma(), first.use_fitted_gamma());
  }
  if (spec.cost_model() != first.cost_model()) {
    return mismatch("cost_model", v1::CostModel_Name(spec.cost_model()),
                    v1::CostModel_Name(first.cost_model()));
  }
  if (spec.measured_attention().SerializeAsString() !=
      first.measured_attention().SerializeAsString()) {
    return mismatch("measured_attention",
                    absl::StrCat("a table of ", spec.measured_attention().pairs_size(), " points"),
                    absl::StrCat("another (of ", first.measured_attention().pairs_size(),
                                 " points)"));
  }
  if (spec.locality() != first.locality()) {
    return mismatch("locality", v1::Locality_Name(spec.locality()),
                    v1::Locality_Name(first.locality()));
  }
  if (spec.max_tokens_per_gpu() != first.max_tokens_per_gpu()) {
    return mismatch("max_tokens_per_gpu", spec.max_tokens_per_gpu(), first.max_tokens_per_gpu());
  }
  // As planned: a field left unset equals its default given explicitly.
  v1::Machine machine, first_machine;
  MachineToProto(checked.machine, &machine);
  MachineToProto(first_checked.machine, &first_machine);
  if (machine.SerializeAsString() != first_machine.SerializeAsString()) {
    return mismatch("machine", absl::StrCat("{", machine.ShortDebugString(), "}"),
                    absl::StrCat("{", first_machine.ShortDebugString(), "}"));
  }
  return absl::OkStatus();
}

}  // namespace

Rendezvous::Place Rendezvous::FindGroup(const v1::StepSpec& spec) {
  auto job_it = jobs_.find(spec.job_id());
  if (job_it == jobs_.end()) return Place();
  auto group_it = job_it->second.groups.find(GroupKey(spec.group_id(), spec.incarnation()));
  if (group_it == job_it->second.groups.end()) return Place();
  return Place{&job_it->second, &group_it->second};
}

std::map<std::string, Rendezvous::Job>::iterator Rendezvous::EvictionVictim(
    const std::string& tenant, const std::map<std::string, int32_t>& jobs_by_tenant,
    bool tenant_full, absl::Time now) {
  auto jobs_of = [&](const std::string& t) {
    auto it = jobs_by_tenant.find(t);
    return it == jobs_by_tenant.end() ? 0 : it->second;
  };
  const int32_t own = jobs_of(tenant);
  // Among the jobs with nothing pending, never planned or idle past the
  // rendezvous timeout: the tenant's own first, then those never planned,
  // then the least recently active (ties: the smallest id).
  auto victim = jobs_.end();
  auto better = [&](const Job& job, const Job& than) {
    if ((job.tenant == tenant) != (than.tenant == tenant)) return job.tenant == tenant;
    if (job.planned != than.planned) return !job.planned;
    return job.last_activity < than.last_activity;
  };
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    const Job& job = it->second;
    if (job.pending != 0) continue;
    if (job.planned && job.last_activity + limits_.rendezvous_timeout > now) continue;
    // Another tenant's job only to a tenant within its own limit, and only
    // from a tenant holding at least as many jobs as it will.
    if (job.tenant != tenant && (tenant_full || jobs_of(job.tenant) <= own)) continue;
    if (victim == jobs_.end() || better(job, victim->second)) victim = it;
  }
  return victim;
}

absl::StatusOr<Rendezvous::Place> Rendezvous::FindOrCreateGroup(const v1::StepSpec& spec,
                                                                const std::string& tenant,
                                                                absl::Time now,
                                                                bool* created) {
  if (created != nullptr) *created = false;
  auto job_it = jobs_.find(spec.job_id());
  if (job_it == jobs_.end()) {
    std::map<std::string, int32_t> jobs_by_tenant;
    for (const auto& [id, job] : jobs_) ++jobs_by_tenant[job.tenant];
    const int32_t tenant_jobs = jobs_by_tenant[tenant];
    const bool tenant_full = tenant_jobs >= limits_.max_jobs_per_tenant;
    if (tenant_full || static_cast<int64_t>(jobs_.size()) >= limits_.max_jobs) {
      // Make room, so that a burst of job ids, stray or stale, can neither
      // lock new jobs out for the job TTL nor push out a job that is
      // training, nor take another tenant's room beyond its share.
      auto victim = EvictionVictim(tenant, jobs_by_tenant, tenant_full, now);
      if (victim == jobs_.end()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "spec.job_id: ",
            tenant_full
                ? absl::StrCat("tenant '", tenant, "' already has ", tenant_jobs,
                               " jobs, its limit (max_jobs_per_tenant), and none of them may "
                               "make room: each")
                : absl::StrCat("the server already tracks ", jobs_.size(),
                               " jobs, its limit, and none may make room for tenant '", tenant,
                               "': each is another tenant's holding no more jobs than it, or"),
            " has a step waiting for ranks or planned one within the rendezvous timeout (idle "
            "jobs are forgotten after ",
            absl::FormatDuration(limits_.job_ttl), ")"));
      }
      evicted_.push_back(victim->first);
      ++jobs_evicted_;
      LogLifetime(LifetimeEvent::Kind::kJobForgotten, victim->first);
      jobs_.erase(victim);
    }
    job_it = jobs_.emplace(spec.job_id(), Job()).first;
    job_it->second.tenant = tenant;
  }
  Job& job = job_it->second;
  const GroupKey key(spec.group_id(), spec.incarnation());
  auto group_it = job.groups.find(key);
  if (group_it == job.groups.end()) {
    for (auto it = job.groups.lower_bound(GroupKey(spec.group_id(), 0));
         it != job.groups.end() && it->first.first == spec.group_id();) {
      if (it->second.pending.empty()) {
        LogLifetime(LifetimeEvent::Kind::kGroupForgotten, spec.job_id(), it->first);
        it = job.groups.erase(it);
        ++groups_replaced_;
      } else {
        ++it;
      }
    }
    if (static_cast<int64_t>(job.groups.size()) >= limits_.max_groups_per_job) {
      // The message first: erasing the job frees `job`.
      absl::Status refused = absl::ResourceExhaustedError(
          absl::StrCat("spec.group_id: job '", spec.job_id(), "' already has ", job.groups.size(),
                       " groups, the server's limit"));
      if (job.groups.empty()) {
        LogLifetime(LifetimeEvent::Kind::kJobForgotten, spec.job_id());
        jobs_.erase(job_it);
      }
      return refused;
    }
    group_it = job.groups.emplace(key, Group()).first;
    LogLifetime(LifetimeEvent::Kind::kGroupAdded, spec.job_id(), key);
    if (created != nullptr) *created = true;
  }
  job.last_activity = now;
  group_it->second.last_activity = now;
  return Place{&job, &group_it->second};
}

void Rendezvous::ForgetIfEmpty(const v1::StepSpec& spec) {
  const Place place = FindGroup(spec);
  if (place.group == nullptr) return;
  if (place.group->pending.empty() && place.group->steps_planned == 0 &&
      place.group->ranks_seen == 0) {
    const GroupKey key(spec.group_id(), spec.incarnation());
    LogLifetime(LifetimeEvent::Kind::kGroupForgotten, spec.job_id(), key);
    place.job->groups.erase(key);
  }
  if (place.job->groups.empty()) {
    LogLifetime(LifetimeEvent::Kind::kJobForgotten, spec.job_id());
    jobs_.erase(spec.job_id());
  }
}

void Rendezvous::LogLifetime(LifetimeEvent::Kind kind, const std::string& job_id,
                             const GroupKey& group) {
  lifetime_.push_back(LifetimeEvent{kind, job_id, group.first, group.second});
}

std::vector<LifetimeEvent> Rendezvous::TakeLifetimeEvents() {
  absl::MutexLock lock(&mu_);
  std::vector<LifetimeEvent> events = std::move(lifetime_);
  lifetime_.clear();
  return events;
}

Rendezvous::Arrival Rendezvous::Arrive(PendingCall* call, CheckedSpec checked, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Arrival arrival = ArriveLocked(call, std::move(checked), now);
  return arrival;
}

Rendezvous::Arrival Rendezvous::ArriveLocked(PendingCall* call, CheckedSpec checked,
                                             absl::Time now) {
  const v1::PlanRequest& request = call->request();
  const v1::StepSpec& spec = request.spec();
  const int32_t rank = request.rank();
  Arrival arrival;
  if (closed_) {
    arrival.status = absl::UnavailableError("the planner is shutting down; retry elsewhere");
    return arrival;
  }
  if (!withdrawn_.empty()) {
    if (auto it = withdrawn_.find(KeyOf(spec)); it != withdrawn_.end()) {
      arrival.status = it->second;
      return arrival;
    }
  }
  bool created = false;
  absl::StatusOr<Place> place = FindOrCreateGroup(spec, call->tenant(), now, &created);
  if (!place.ok()) {
    arrival.status = place.status();
    return arrival;
  }
  Group& group = *place->group;
  Job& job = *place->job;
  if (WasAnswered(group.answered, spec.step())) {
    arrival.status = absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, ": ", StepName(spec),
                     " was already planned and every rank was answered"));
    return arrival;
  }
  auto step_it = group.pending.find(spec.step());
  if (step_it == group.pending.end()) {
    // Before making room: a step that would be refused takes none.
    if (job.pending >= limits_.max_pending_steps_per_job) {
      arrival.status = absl::ResourceExhaustedError(absl::StrCat(
          "spec.step: job '", spec.job_id(), "' already has ", job.pending,
          " steps waiting for ranks, the server's limit per job; ", StepName(spec),
          " was not opened"));
      if (created) ForgetIfEmpty(spec);
      return arrival;
    }
    if (request.sequence_lengths_size() > limits_.max_sequences_per_step) {
      arrival.status = absl::ResourceExhaustedError(absl::StrCat(
          "sequence_lengths: ", request.sequence_lengths_size(),
          " sequences exceed the limit of ", limits_.max_sequences_per_step, " per step"));
      if (created) ForgetIfEmpty(spec);
      return arrival;
    }
    if (pending_steps_ >= limits_.max_pending_steps &&
        !MakeRoomFor(job, spec, &arrival.evicted)) {
      arrival.status = absl::ResourceExhaustedError(
          absl::StrCat("spec.step: ", pending_steps_,
                       " steps are already waiting for ranks, the server's limit; ",
                       StepName(spec), " was not opened"));
      if (created) ForgetIfEmpty(spec);
      return arrival;
    }
    auto step = std::make_unique<Step>(Step{spec, checked, now,
                                            std::vector<bool>(spec.world_size(), false),
                                            {}, 0});
    step_it = group.pending.emplace(spec.step(), std::move(step)).first;
    ++pending_steps_;
    ++job.pending;
  } else {
    const Step& step = *step_it->second;
    arrival.status = CompareSpecs(step.spec, step.checked, spec, checked, rank);
    if (!arrival.status.ok()) return arrival;
  }
  Step& step = *step_it->second;
  if (step.arrived[rank]) {
    arrival.status = absl::AlreadyExistsError(
        absl::StrCat("rank ", rank, ": already waiting in ", StepName(spec)));
    return arrival;
  }
  const int64_t sequences = request.sequence_lengths_size();
  if (step.sequences + sequences > limits_.max_sequences_per_step) {
    arrival.status = absl::ResourceExhaustedError(absl::StrCat(
        "sequence_lengths: rank ", rank, " would bring ", StepName(spec), " to ",
        step.sequences + sequences, " sequences, over the limit of ",
        limits_.max_sequences_per_step, " per step"));
    return arrival;
  }
  int64_t mask_spans = 0;
  for (const v1::AttentionMask& mask : request.attention_masks()) {
    mask_spans += mask.span_lengths_size();
  }
  if (step.mask_spans + mask_spans > limits_.max_mask_spans_per_step) {
    arrival.status = absl::ResourceExhaustedError(absl::StrCat(
        "attention_masks: rank ", rank, " would bring ", StepName(spec), " to ",
        step.mask_spans + mask_spans, " spans, over the limit of ",
        limits_.max_mask_spans_per_step, " per step"));
    return arrival;
  }
  step.sequences += sequences;
  step.mask_spans += mask_spans;
  step.arrived[rank] = true;
  step.calls.push_back(call);

  if (group.seen.size() < static_cast<size_t>(spec.world_size())) {
    group.seen.resize(spec.world_size(), false);
  }
  if (!group.seen[rank]) {
    group.seen[rank] = true;
    ++group.ranks_seen;
  }

  if (static_cast<int32_t>(step.calls.size()) < spec.world_size()) return arrival;

  std::vector<PendingCall*> by_rank(spec.world_size(), nullptr);
  for (PendingCall* c : step.calls) by_rank[c->request().rank()] = c;
  // Each call reads the clock before it takes the lock: the last to arrive
  // may have read it before the first did. Its wait is then 0, not negative
  // (a negative wait is not observed at all, and the step would be missing
  // from the rendezvous-wait histogram).
  auto ready = std::make_unique<ReadyStep>(ReadyStep{std::move(step.spec), job.tenant,
                                                     std::move(step.checked),
                                                     std::move(by_rank),
                                                     step.first_arrival,
                                                     std::max(step.first_arrival, now),
                                                     step.sequences});
  ErasePending(job, group, step_it);
  group.answered.push_back(ready->spec.step());
  while (static_cast<int32_t>(group.answered.size()) > limits_.remembered_steps) {
    group.answered.pop_front();
  }
  arrival.ready = std::move(ready);
  return arrival;
}

bool Rendezvous::Leave(PendingCall* call) {
  const v1::StepSpec& spec = call->request().spec();
  absl::MutexLock lock(&mu_);
  const Place place = FindGroup(spec);
  if (place.group == nullptr) return false;
  Group& group = *place.group;
  auto step_it = group.pending.find(spec.step());
  if (step_it == group.pending.end()) return false;
  Step& step = *step_it->second;
  auto it = std::find(step.calls.begin(), step.calls.end(), call);
  if (it == step.calls.end()) return false;
  step.calls.erase(it);
  step.arrived[call->request().rank()] = false;
  step.sequences -= call->request().sequence_lengths_size();
  if (step.calls.empty()) ErasePending(*place.job, group, step_it);
  return true;
}

Rendezvous::StepKey Rendezvous::KeyOf(const v1::StepSpec& spec) {
  return StepKey(spec.job_id(), spec.group_id(), spec.incarnation(), spec.step());
}

std::optional<FailedCalls> Rendezvous::Withdraw(const v1::StepSpec& spec,
                                                const CheckedSpec& checked, int32_t rank,
                                                const absl::Status& refusal, absl::Time now) {
  absl::MutexLock lock(&mu_);
  StepKey key = KeyOf(spec);
  if (closed_ || withdrawn_.count(key) > 0) return std::nullopt;
  FailedCalls failed;
  failed.job_id = spec.job_id();
  failed.status = absl::AbortedError(
      absl::StrCat(StepName(spec), ": rank ", rank,
                   "'s request was refused, so the step cannot complete: ", refusal.message()));
  const Place place = FindGroup(spec);
  if (place.group != nullptr) {
    Group& group = *place.group;
    if (WasAnswered(group.answered, spec.step())) return std::nullopt;
    auto step_it = group.pending.find(spec.step());
    if (step_it != group.pending.end()) {
      Step& step = *step_it->second;
      if (step.arrived[rank] || !CompareSpecs(step.spec, step.checked, spec, checked, rank).ok()) {
        return std::nullopt;  // not a rank this step waits for
      }
      failed.calls = std::move(step.calls);
      ErasePending(*place.job, group, step_it);
      group.last_activity = now;
      place.job->last_activity = now;
    }
  }
  withdrawn_.emplace(key, failed.status);
  withdrawn_order_.push_back(std::move(key));
  while (static_cast<int32_t>(withdrawn_order_.size()) > limits_.max_pending_steps) {
    withdrawn_.erase(withdrawn_order_.front());
    withdrawn_order_.pop_front();
  }
  return failed;
}

Rendezvous::PendingSteps::iterator Rendezvous::ErasePending(Job& job, Group& group,
                                                           PendingSteps::iterator it) {
  --pending_steps_;
  --job.pending;
  return group.pending.erase(it);
}

std::vector<FailedCalls> Rendezvous::Expire(absl::Time now) {
  std::vector<FailedCalls> failed;
  absl::MutexLock lock(&mu_);
  for (auto& [job_id, job] : jobs_) {
    if (job.pending == 0) continue;
    for (auto& [key, group] : job.groups) {
      for (auto it = group.pending.begin(); it != group.pending.end();) {
        Step& step = *it->second;
        if (step.first_arrival + limits_.rendezvous_timeout > now) {
          ++it;
          continue;
        }
        const int32_t missing =
            step.spec.world_size() - static_cast<int32_t>(step.calls.size());
        FailedCalls f;
        f.job_id = job_id;
        f.calls = std::move(step.calls);
        f.status = absl::DeadlineExceededError(absl::StrCat(
            StepName(step.spec), ": ", missing, " of ", step.spec.world_size(),
            " ranks did not ask within the rendezvous timeout of ",
            absl::FormatDuration(limits_.rendezvous_timeout),
            "; missing ranks: ", MissingRankRanges(step.arrived)));
        failed.push_back(std::move(f));
        it = ErasePending(job, group, it);
      }
    }
  }
  return failed;
}

absl::Time Rendezvous::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, job] : jobs_) {
    if (job.pending == 0) continue;
    for (const auto& [key, group] : job.groups) {
      for (const auto& [step, pending] : group.pending) {
        next = std::min(next, pending->first_arrival + limits_.rendezvous_timeout);
      }
    }
  }
  return next;
}

std::vector<PendingCall*> Rendezvous::Close() {
  std::vector<PendingCall*> calls;
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (auto& [job_id, job] : jobs_) {
    for (auto& [key, group] : job.groups) {
      for (auto& [step, pending] : group.pending) {
        calls.insert(calls.end(), pending->calls.begin(), pending->calls.end());
      }
      group.pending.clear();
    }
    job.pending = 0;
  }
  pending_steps_ = 0;
  return calls;
}

absl::Status Rendezvous::Touch(const v1::StepSpec& spec, const std::string& tenant,
                               absl::Time now) {
  absl::MutexLock lock(&mu_);
  absl::Status status = absl::UnavailableError("the planner is shutting down; retry elsewhere");
  if (!closed_) status = FindOrCreateGroup(spec, tenant, now).status();
  return status;
}

void Rendezvous::RecordPlanned(const v1::StepSpec& spec, const std::string& topology,
                               const v1::Balance& balance, absl::Time now) {
  absl::MutexLock lock(&mu_);
  const Place place = FindGroup(spec);
  if (place.group == nullptr) return;
  Group& group = *place.group;
  if (group.steps_planned == 0) {
    Log(LogLevel::kInfo,
        absl::StrCat(place.job->planned ? "job '" : "new job '", spec.job_id(), "'",
                     place.job->planned ? ": new " : ": ",
                     spec.group_id().empty() ? "" : absl::StrCat("group '", spec.group_id(), "' "),
                     "incarnation ", absl::Hex(spec.incarnation()), ", ", spec.world_size(),
                     " ranks, topology ", topology, ", from step ", spec.step(),
                     place.job->planned ? " (a restart, or another run with this job id)" : ""));
  }
  // A planned step had every rank: in group mode (one PlanGroup call for
  // all) as in per-rank mode (every rank's request).
  if (group.ranks_seen < spec.world_size()) {
    group.seen.assign(spec.world_size(), true);
    group.ranks_seen = spec.world_size();
  }
  ++group.steps_planned;
  group.last_step = spec.step();
  group.world_size = spec.world_size();
  group.topology = topology;
  group.has_balance = true;
  group.last_balance = balance;
  group.last_activity = now;
  place.job->last_activity = now;
  place.job->planned = true;
}

std::vector<std::string> Rendezvous::DropIdleJobs(absl::Time now) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> dropped = std::move(evicted_);
  evicted_.clear();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.pending == 0 && it->second.last_activity + limits_.job_ttl <= now) {
      dropped.push_back(it->first);
      LogLifetime(LifetimeEvent::Kind::kJobForgotten, it->first);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

absl::StatusOr<v1::JobState> Rendezvous::GetJob(const std::string& job_id,
                                                absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto job_it = jobs_.find(job_id);
  if (job_it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job_id: the server knows no job '", job_id,
                                            "' (never seen, or idle longer than ",
                                            absl::FormatDuration(limits_.job_ttl), ")"));
  }
  const Job& job = job_it->second;
  v1::JobState state;
  state.set_job_id(job_id);
  state.set_idle_seconds(absl::ToDoubleSeconds(now - job.last_activity));
  for (const auto& [key, group] : job.groups) {
    v1::GroupState* g = state.add_groups();
    g->set_group_id(key.first);
    g->set_incarnation(key.second);
    g->set_world_size(group.world_size);
    g->set_topology(group.topology);
    g->set_steps_planned(group.steps_planned);
    g->set_last_step(group.last_step);
    if (group.has_balance) *g->mutable_last_balance() = group.last_balance;
    g->set_ranks_seen(group.ranks_seen);
    for (const auto& [step_number, step] : group.pending) {
      v1::PendingStep* p = g->add_pending();
      p->set_step(step_number);
      p->set_ranks_arrived(static_cast<int32_t>(step->calls.size()));
      p->set_world_size(step->spec.world_size());
      p->set_waiting_ms(absl::ToInt64Milliseconds(now - step->first_arrival));
      p->set_missing_ranks(MissingRankRanges(step->arrived));
    }
  }
  return state;
}

std::vector<GroupGauges> Rendezvous::Gauges() const {
  gauge_reads_.fetch_add(1, std::memory_order_relaxed);
  std::vector<GroupGauges> gauges;
  absl::MutexLock lock(&mu_);
  for (const auto& [job_id, job] : jobs_) {
    for (auto it = job.groups.begin(); it != job.groups.end(); ++it) {
      // One series per group: while an older incarnation still has a
      // pending step, the most recently active one speaks for the group.
      const auto& [key, group] = *it;
      bool newest = true;
      for (auto other = job.groups.lower_bound(GroupKey(key.first, 0));
           other != job.groups.end() && other->first.first == key.first; ++other) {
        if (other != it && (other->second.last_activity > group.last_activity ||
                            (other->second.last_activity == group.last_activity &&
                             other->first.second > key.second))) {
          newest = false;
        }
      }
      if (!newest) continue;
      GroupGauges g;
      g.job_id = job_id;
      g.group_id = key.first;
      g.pending_steps = static_cast<int32_t>(group.pending.size());
      g.ranks_seen = group.ranks_seen;
      g.has_balance = group.has_balance;
      g.last_balance = group.last_balance;
      gauges.push_back(std::move(g));
    }
  }
  return gauges;
}

int32_t Rendezvous::pending_steps() const {
  absl::MutexLock lock(&mu_);
  return pending_steps_;
}

bool Rendezvous::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

int32_t Rendezvous::jobs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(jobs_.size());
}

int64_t Rendezvous::jobs_evicted() const {
  absl::MutexLock lock(&mu_);
  return jobs_evicted_;
}

int64_t Rendezvous::steps_evicted() const {
  absl::MutexLock lock(&mu_);
  return steps_evicted_;
}

bool Rendezvous::MakeRoomFor(const Job& job, const v1::StepSpec& spec,
                             std::vector<FailedCalls>* evicted) {
  std::map<std::string, int32_t> pending_by_tenant;
  for (const auto& [id, other] : jobs_) pending_by_tenant[other.tenant] += other.pending;
  auto tenant = pending_by_tenant.end();
  for (auto it = pending_by_tenant.begin(); it != pending_by_tenant.end(); ++it) {
    if (tenant == pending_by_tenant.end() || it->second > tenant->second) tenant = it;
  }
  if (tenant == pending_by_tenant.end() || tenant->first == job.tenant ||
      tenant->second < pending_by_tenant[job.tenant] + 2) {
    return false;
  }
  auto holder = jobs_.end();
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (it->second.tenant != tenant->first) continue;
    if (holder == jobs_.end() || it->second.pending > holder->second.pending) holder = it;
  }
  if (holder == jobs_.end()) return false;
  Group* oldest_group = nullptr;
  PendingSteps::iterator oldest;
  for (auto& [key, group] : holder->second.groups) {
    for (auto it = group.pending.begin(); it != group.pending.end(); ++it) {
      if (oldest_group == nullptr || it->second->first_arrival < oldest->second->first_arrival) {
        oldest_group = &group;
        oldest = it;
      }
    }
  }
  if (oldest_group == nullptr) return false;  // pending counts say otherwise; refuse
  FailedCalls f;
  f.job_id = holder->first;
  f.calls = std::move(oldest->second->calls);
  f.status = absl::ResourceExhaustedError(absl::StrCat(
      StepName(oldest->second->spec), ": given up to make room for ", StepName(spec),
      "; tenant '", tenant->first, "' held ", tenant->second, " of the server's ",
      limits_.max_pending_steps, " pending steps"));
  evicted->push_back(std::move(f));
  ErasePending(holder->second, *oldest_group, oldest);
  ++steps_evicted_;
  return true;
}

int64_t Rendezvous::groups_replaced() const {
  absl::MutexLock lock(&mu_);
  return groups_replaced_;
}

}  // namespace knapformer
