#ifndef KNAPFORMER_SERVER_SERVICE_METRICS_H_
#define KNAPFORMER_SERVER_SERVICE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "knapformer/v1/planner.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/cost_fits.h"
#include "server/job_auth.h"
#include "server/rendezvous.h"

namespace knapformer {

// The planner's Prometheus metrics, all labelled by job (README "Metrics"):
//   knapformer_planner_requests_total{job,method,code}      counter
//   knapformer_planner_steps_total{job}                     counter, steps planned
//   knapformer_planner_rendezvous_timeouts_total{job}       counter, steps expired
//   knapformer_planner_tokens_total{job}                    counter, tokens planned
//   knapformer_planner_moved_tokens_total{job}              counter, tokens the route moves
//   knapformer_planner_moved_bytes_total{job}               counter, the same in bytes
//   knapformer_planner_planning_duration_seconds{job}       histogram, solve time
//   knapformer_planner_rendezvous_wait_seconds{job}         histogram, first to last rank
// and, read from the rendezvous and the gamma fits at each scrape (so they
// vanish with the job):
//   knapformer_planner_{wir,max_over_mean}_{before,after}_ratio{job,group}  gauges
//   knapformer_planner_predicted_step_seconds{job,group}
//   knapformer_planner_bag_gpus{job,group,gpus}
//   knapformer_planner_pending_steps{job,group}, knapformer_planner_ranks_seen{job,group}
//   knapformer_planner_jobs
//   knapformer_planner_fitted_gamma{job,group}
//   knapformer_rank_speed{job,group,rank}    a rank's speed over its group's median, for
//                                            ranks 5% or more away (PlanGroupRequest.rank_speeds)
// and under --auth=token, from the key file and revocation list as last read:
//   knapformer_planner_auth_keys               gauge, usable keys (0: every
//                                              token refused, failing closed)
//   knapformer_planner_auth_revoked_tokens     gauge, token ids revoked
// Label cardinality is bounded: at most `max_jobs` job values (more are counted
// under job=""), and series of jobs idle for the TTL are removed. Thread-safe.
class ServiceMetrics {
 public:
  // The per-group gauges are a snapshot of the rendezvous and the fits made
  // at most once per `gauge_interval`, whatever the scrape rate.
  ServiceMetrics(const Rendezvous* rendezvous, const CostFits* fits, int32_t max_jobs,
                 absl::Duration gauge_interval = absl::Seconds(1));
  ~ServiceMetrics();

  // Counters and histograms; and the per-group gauges (a Collectable that
  // reads the rendezvous and the fits). Register both with an Exposer.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::shared_ptr<prometheus::Collectable> gauges() const { return gauges_; }

  // `job` may be "" for requests that named no valid job.
  void CountRequest(const std::string& job, const char* method, absl::StatusCode code,
                    absl::Time now);
  // `token_bytes`: the step's StepSpec.token_bytes, which a client sets to
  // what its previous step's route moved per token (0 at its first step,
  // whose bytes it cannot know yet): moved tokens planned with 0 are
  // counted in bytes at the job's next step that has them, so the bytes
  // counter covers every step. `wait_seconds` < 0: no rendezvous (PlanGroup).
  void RecordStep(const std::string& job, const v1::Balance& balance, int64_t token_bytes,
                  double plan_seconds, double wait_seconds, absl::Time now);
  void CountTimeout(const std::string& job, absl::Time now);
  // Sets the auth gauges (registered at the first call).
  void SetAuthFiles(const AuthFilesState& state);

  // Removes every series of jobs not used for `ttl`.
  void DropIdleJobs(absl::Time now, absl::Duration ttl);

 private:
  struct JobSeries;
  JobSeries& Series(const std::string& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveSeries(JobSeries& series) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t max_jobs_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> gauges_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& timeouts_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Counter>& moved_tokens_;
  prometheus::Family<prometheus::Counter>& moved_bytes_;
  prometheus::Family<prometheus::Histogram>& planning_seconds_;
  prometheus::Family<prometheus::Histogram>& wait_seconds_;

  absl::Mutex mu_;
  prometheus::Gauge* auth_keys_ ABSL_GUARDED_BY(mu_) = nullptr;
  prometheus::Gauge* auth_revoked_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, std::unique_ptr<JobSeries>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_SERVICE_METRICS_H_
