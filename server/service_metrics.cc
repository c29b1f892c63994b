#include "server/service_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "planner/plan.h"
#include "prometheus/metric_family.h"

namespace knapformer {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

const prometheus::Histogram::BucketBoundaries kPlanningBuckets = {
    1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
const prometheus::Histogram::BucketBoundaries kWaitBuckets = {
    1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10, 30, 100};

// Gauges read from the rendezvous and the gamma fits: a snapshot made at
// most once per `interval` (a second by default) and copied by every scrape
// in between, so that scrapes, however frequent (a scraper's retry loop, a
// stranger on the metrics port), take the rendezvous' lock for O(groups)
// at most once per interval.
class GroupGaugeCollector final : public prometheus::Collectable {
 public:
  GroupGaugeCollector(const Rendezvous* rendezvous, const CostFits* fits,
                      absl::Duration interval)
      : rendezvous_(rendezvous), fits_(fits), interval_(interval) {}

  std::vector<MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - taken_ >= interval_) {
      snapshot_ = Snapshot();
      taken_ = now;
    }
    return snapshot_;
  }

 private:
  std::vector<MetricFamily> Snapshot() const {
    const std::vector<GroupGauges> groups = rendezvous_->Gauges();
    const std::map<std::string, double> gammas = fits_->FittedGammas();
    std::vector<MetricFamily> families;
    auto family = [&](const char* name, const char* help) -> MetricFamily& {
      families.push_back(MetricFamily{name, help, MetricType::Gauge, {}});
      return families.back();
    };
    auto add = [](MetricFamily& f, const GroupGauges& g, double value) {
      ClientMetric m;
      m.label = {{"group", g.group_id}, {"job_id", g.job_id}};
      m.gauge.value = value;
      f.metric.push_back(std::move(m));
    };
    MetricFamily& jobs = family("knapformer_planner_jobs", "Jobs the planner tracks.");
    ClientMetric count;
    count.gauge.value = rendezvous_->jobs();
    jobs.metric.push_back(count);

    MetricFamily& pending =
        family("knapformer_planner_pending_steps", "Steps waiting for ranks, per group.");
    for (const GroupGauges& g : groups) add(pending, g, g.pending_steps);
    MetricFamily& seen = family("knapformer_planner_ranks_seen",
                                "Distinct ranks of a group that took part in a step: every rank of a "
                                "planned step (PlanGroup or Plan), and in per-rank mode the "
                                "ranks that have sent a Plan request before one was.");
    for (const GroupGauges& g : groups) add(seen, g, g.ranks_seen);

    struct Ratio {
      const char* name;
      const char* help;
      double (v1::Balance::*get)() const;
    };
    const Ratio ratios[] = {
        {"knapformer_planner_wir_before_ratio",
         "Workload imbalance ratio (max/min per GPU) of the last planned step without "
         "balancing.",
         &v1::Balance::wir_before},
        {"knapformer_planner_wir_after_ratio",
         "Workload imbalance ratio (max/min per GPU) of the last planned step's plan.",
         &v1::Balance::wir_after},
        {"knapformer_planner_max_over_mean_before_ratio",
         "Max over mean per-GPU workload of the last planned step without balancing.",
         &v1::Balance::max_over_mean_before},
        {"knapformer_planner_max_over_mean_after_ratio",
         "Max over mean per-GPU workload of the last planned step's plan.",
         &v1::Balance::max_over_mean_after},
    };
    for (const Ratio& ratio : ratios) {
      MetricFamily& f = family(ratio.name, ratio.help);
      for (const GroupGauges& g : groups) {
        if (g.has_balance) add(f, g, (g.last_balance.*ratio.get)());
      }
    }
    MetricFamily& predicted = family(
        "knapformer_planner_predicted_step_seconds",
        "A prediction, not a measurement: seconds of one transformer block's forward on the "
        "slowest GPU of the last planned step (compute + Ulysses + route), priced on the "
        "machine the job's spec names (an H100 node when it names none), whatever the job "
        "runs on (Balance.predicted_step_seconds).");
    for (const GroupGauges& g : groups) {
      if (g.has_balance && g.last_balance.predicted_step_seconds() > 0) {
        add(predicted, g, g.last_balance.predicted_step_seconds());
      }
    }
    MetricFamily& speed = family(
        "knapformer_rank_speed",
        "Relative compute speed of a rank in the last planned step (PlanGroupRequest.rank_speeds, "
        "declared or learned by the ranks), over the group's median rank: only ranks 5% or more "
        "away from it (a slow GPU the plans balance around).");
    for (const GroupGauges& g : groups) {
      if (!g.has_balance || g.last_balance.rank_speeds().empty()) continue;
      const auto& speeds = g.last_balance.rank_speeds();
      std::vector<double> sorted(speeds.begin(), speeds.end());
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      const double median = sorted[sorted.size() / 2];
      for (int r = 0; r < speeds.size(); ++r) {
        const double relative = speeds[r] / median;
        if (std::abs(relative - 1.0) < 0.05) continue;
        add(speed, g, relative);
        auto& labels = speed.metric.back().label;  // names sorted: rank last
        labels.push_back({"rank", std::to_string(r)});
      }
    }
    MetricFamily& bag_gpus = family(
        "knapformer_planner_bag_gpus",
        "GPUs in bags of `gpus` GPUs in the last planned step's layout (under topology auto, "
        "the layout the planner chose).");
    for (const GroupGauges& g : groups) {
      if (!g.has_balance) continue;
      for (const v1::BagSizeGpus& size : g.last_balance.gpus_by_bag_size()) {
        add(bag_gpus, g, size.gpus());
        auto& labels = bag_gpus.metric.back().label;  // names sorted: gpus first
        labels.insert(labels.begin(), {"gpus", std::to_string(size.bag_gpus())});
      }
    }
    MetricFamily& gamma = family("knapformer_planner_fitted_gamma",
                                 "Gamma fitted to the job's step timings (PlanRequest.previous).");
    for (const GroupGauges& g : groups) {
      auto fitted = gammas.find(g.job_id);  // the job's
      if (fitted != gammas.end()) add(gamma, g, fitted->second);
    }
    return families;
  }

  const Rendezvous* rendezvous_;
  const CostFits* fits_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  mutable std::vector<MetricFamily> snapshot_ ABSL_GUARDED_BY(mu_);
  mutable absl::Time taken_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace

struct ServiceMetrics::JobSeries {
  std::string job;
  absl::Time last_use;
  std::map<std::pair<std::string, absl::StatusCode>, prometheus::Counter*> requests;
  prometheus::Counter* steps;
  prometheus::Counter* timeouts;
  prometheus::Counter* tokens;
  prometheus::Counter* moved_tokens;
  prometheus::Counter* moved_bytes;
  prometheus::Histogram* planning_seconds;
  prometheus::Histogram* wait_seconds;
  // Moved tokens of steps planned without their bytes per token (a
  // client's first step), counted in bytes at the next step that has them.
  int64_t moved_tokens_without_bytes = 0;
};

ServiceMetrics::ServiceMetrics(const Rendezvous* rendezvous, const CostFits* fits,
                               int32_t max_jobs, absl::Duration gauge_interval)
    : max_jobs_(max_jobs),
      registry_(std::make_shared<prometheus::Registry>()),
      gauges_(std::make_shared<GroupGaugeCollector>(rendezvous, fits, gauge_interval)),
      requests_(prometheus::BuildCounter()
                    .Name("knapformer_planner_requests_total")
                    .Help("Planner RPCs answered, by method and gRPC status code.")
                    .Register(*registry_)),
      steps_(prometheus::BuildCounter()
                 .Name("knapformer_planner_steps_total")
                 .Help("Steps planned (Plan rendezvous completed or PlanGroup answered).")
                 .Register(*registry_)),
      timeouts_(prometheus::BuildCounter()
                    .Name("knapformer_planner_rendezvous_timeouts_total")
                    .Help("Steps failed because ranks were missing at the rendezvous timeout.")
                    .Register(*registry_)),
      tokens_(prometheus::BuildCounter()
                  .Name("knapformer_planner_tokens_total")
                  .Help("Tokens in planned steps.")
                  .Register(*registry_)),
      moved_tokens_(prometheus::BuildCounter()
                        .Name("knapformer_planner_moved_tokens_total")
                        .Help("Tokens the planned routes send to another rank (the reverse "
                              "route sends them back again).")
                        .Register(*registry_)),
      moved_bytes_(prometheus::BuildCounter()
                       .Name("knapformer_planner_moved_bytes_total")
                       .Help("Bytes the planned routes send to another rank, from the "
                             "clients' token_bytes (a client's first step, before its route "
                             "has told it the bytes per token, is counted at its next step).")
                       .Register(*registry_)),
      planning_seconds_(prometheus::BuildHistogram()
                            .Name("knapformer_planner_planning_duration_seconds")
                            .Help("Time to solve one step's plan.")
                            .Register(*registry_)),
      wait_seconds_(prometheus::BuildHistogram()
                        .Name("knapformer_planner_rendezvous_wait_seconds")
                        .Help("Per-rank mode only: time from a step's first rank request "
                              "to its last (group mode sends one PlanGroup: no rendezvous).")
                        .Register(*registry_)) {}

ServiceMetrics::~ServiceMetrics() = default;

void ServiceMetrics::SetAuthFiles(const AuthFilesState& state) {
  absl::MutexLock lock(&mu_);
  if (auth_keys_ == nullptr) {
    auth_keys_ = &prometheus::BuildGauge()
                      .Name("knapformer_planner_auth_keys")
                      .Help("--auth=token: usable keys in the key file as last read; 0 while "
                            "it or the revocation list is missing, empty, unreadable or "
                            "malformed, when every token is refused (failing closed).")
                      .Register(*registry_)
                      .Add({});
    auth_revoked_ = &prometheus::BuildGauge()
                         .Name("knapformer_planner_auth_revoked_tokens")
                         .Help("--auth=token: token ids in the revocation list as last read.")
                         .Register(*registry_)
                         .Add({});
  }
  auth_keys_->Set(static_cast<double>(state.keys));
  auth_revoked_->Set(static_cast<double>(state.revoked_tokens));
}

ServiceMetrics::JobSeries& ServiceMetrics::Series(const std::string& job, absl::Time now) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    if (!job.empty() && static_cast<int32_t>(jobs_.size()) >= max_jobs_) {
      return Series("", now);
    }
    auto series = std::make_unique<JobSeries>();
    const prometheus::Labels labels = {{"job_id", job}};
    series->job = job;
    series->steps = &steps_.Add(labels);
    series->timeouts = &timeouts_.Add(labels);
    series->tokens = &tokens_.Add(labels);
    series->moved_tokens = &moved_tokens_.Add(labels);
    series->moved_bytes = &moved_bytes_.Add(labels);
    series->planning_seconds = &planning_seconds_.Add(labels, kPlanningBuckets);
    series->wait_seconds = &wait_seconds_.Add(labels, kWaitBuckets);
    it = jobs_.emplace(job, std::move(series)).first;
  }
  it->second->last_use = now;
  return *it->second;
}

void ServiceMetrics::RemoveSeries(JobSeries& series) {
  for (auto& [key, counter] : series.requests) requests_.Remove(counter);
  steps_.Remove(series.steps);
  timeouts_.Remove(series.timeouts);
  tokens_.Remove(series.tokens);
  moved_tokens_.Remove(series.moved_tokens);
  moved_bytes_.Remove(series.moved_bytes);
  planning_seconds_.Remove(series.planning_seconds);
  wait_seconds_.Remove(series.wait_seconds);
}

void ServiceMetrics::CountRequest(const std::string& job, const char* method,
                                  absl::StatusCode code, absl::Time now) {
  absl::MutexLock lock(&mu_);
  JobSeries& series = Series(job, now);
  auto key = std::make_pair(std::string(method), code);
  auto it = series.requests.find(key);
  if (it == series.requests.end()) {
    prometheus::Counter* counter = &requests_.Add({{"job_id", series.job},
                                                   {"method", method},
                                                   {"code", absl::StatusCodeToString(code)}});
    it = series.requests.emplace(key, counter).first;
  }
  it->second->Increment();
}

void ServiceMetrics::RecordStep(const std::string& job, const v1::Balance& balance,
                                int64_t token_bytes, double plan_seconds, double wait_seconds,
                                absl::Time now) {
  absl::MutexLock lock(&mu_);
  JobSeries& series = Series(job, now);
  series.steps->Increment();
  series.tokens->Increment(static_cast<double>(balance.total_tokens()));
  series.moved_tokens->Increment(static_cast<double>(balance.moved_tokens()));
  if (token_bytes > 0) {
    series.moved_bytes->Increment(
        static_cast<double>(balance.moved_bytes()) +
        static_cast<double>(MovedBytes(series.moved_tokens_without_bytes, token_bytes)));
    series.moved_tokens_without_bytes = 0;
  } else {
    series.moved_tokens_without_bytes += balance.moved_tokens();
  }
  series.planning_seconds->Observe(plan_seconds);
  if (wait_seconds >= 0) series.wait_seconds->Observe(wait_seconds);
}

void ServiceMetrics::CountTimeout(const std::string& job, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Series(job, now).timeouts->Increment();
}

void ServiceMetrics::DropIdleJobs(absl::Time now, absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->last_use + ttl <= now) {
      RemoveSeries(*it->second);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace knapformer
