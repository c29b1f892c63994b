#ifndef KNAPFORMER_CLIENT_FALLBACK_POLICY_H_
#define KNAPFORMER_CLIENT_FALLBACK_POLICY_H_

// When a PlannerClient with a service asks it and when its ranks plan
// locally instead. Every input is a step number or an outcome the ranks
// agreed on, so every rank's policy is in the same state at every step.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "client/step_plan.h"

namespace knapformer {

class FallbackPolicy {
 public:
  // The service's `address` (empty: none is configured, every step is
  // planned locally), this `rank` and whether one rank (group mode) or
  // every rank probes the service: for the log lines.
  FallbackPolicy(std::string address, int rank, bool group_mode);

  // Logs that the plans come from `source` from `step` on (`why`: the
  // service's address, or why not), when that changes: a warning for local
  // planning while a service is configured.
  void LogSource(PlanSource source, uint64_t step, const std::string& why);

  // The service failed a step and has not been answered by every probing
  // rank's probe since (or the hold after a relapse is not over).
  bool service_down() const { return service_down_; }

  // After `step` failed at the service for `why`: plan locally, probing it,
  // from the next step. A failure within kRelapseSteps of going back to the
  // service is a relapse: the local stretch after one doubles (up to
  // kMaxHoldSteps), so that a service that answers probes but fails steps
  // (overloaded, slow to plan) does not cost a step every few steps.
  // REQUIRES: the caller starts its probes.
  void MarkDown(uint64_t step, const std::string& why);

  // After the service refused the job's credentials at `step` (`why`):
  // local planning for the rest of the run, without probes. Credentials do
  // not mend themselves; a restart with the right ones does.
  void MarkRefused(uint64_t step, const std::string& why);

  // At `step` with the service down: when every probing rank's last probe
  // was answered and the hold is over, the service is asked again from the
  // next step. True when it was just brought back (the caller stops its
  // probes).
  bool MaybeBackUp(uint64_t step, bool probes_answered);

  // Counts `step`, planned locally although a service is configured, for
  // local_reason(); rank 0 warns at the 10th and every kLocalStepsWarning.
  void CountLocalStep(uint64_t step);
  void set_local_reason(std::string why) { local_reason_ = std::move(why); }
  int64_t local_steps() const { return local_steps_; }
  const std::string& local_reason() const { return local_reason_; }

  static constexpr uint64_t kRelapseSteps = 16;
  static constexpr uint64_t kMaxHoldSteps = 256;
  static constexpr int64_t kLocalStepsWarning = 100;

 private:
  const std::string address_;
  std::optional<PlanSource> logged_source_;
  const int rank_;
  const bool group_mode_;
  bool service_down_ = false;
  bool refused_ = false;
  uint64_t down_since_step_ = 0;
  uint64_t back_at_step_ = 0;
  uint64_t hold_steps_ = 0;
  bool ever_back_ = false;
  int64_t local_steps_ = 0;
  std::string local_reason_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_FALLBACK_POLICY_H_
