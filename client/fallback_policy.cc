#include "client/fallback_policy.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace knapformer {

FallbackPolicy::FallbackPolicy(std::string address, int rank, bool group_mode)
    : address_(std::move(address)), rank_(rank), group_mode_(group_mode) {}

void FallbackPolicy::LogSource(PlanSource source, uint64_t step, const std::string& why) {
  if (logged_source_ == source) return;
  logged_source_ = source;
  Log(source == PlanSource::kLocal && !address_.empty() ? LogLevel::kWarning : LogLevel::kInfo,
      absl::StrCat("rank ", rank_, ": planning from step ", step, " with the ",
                   PlanSourceName(source), why.empty() ? "" : absl::StrCat(" (", why, ")")));
}

void FallbackPolicy::MarkDown(uint64_t step, const std::string& why) {
  local_reason_ = why;
  service_down_ = true;
  const bool relapse = ever_back_ && step < back_at_step_ + kRelapseSteps;
  hold_steps_ =
      relapse ? std::min<uint64_t>(std::max<uint64_t>(1, 2 * hold_steps_), kMaxHoldSteps) : 0;
  down_since_step_ = step;
  if (hold_steps_ > 0) {
    Log(LogLevel::kWarning,
        absl::StrCat("rank ", rank_, ": the planner service failed step ", step, " again ",
                     step - back_at_step_,
                     " steps after it was used again; planning locally for at least ", hold_steps_,
                     " steps"));
  }
}

void FallbackPolicy::MarkRefused(uint64_t step, const std::string& why) {
  local_reason_ = why;
  service_down_ = true;
  refused_ = true;
  down_since_step_ = step;
  // The same on every rank: said once, by rank 0 (`why` names the rank
  // that was refused).
  if (rank_ != 0) return;
  Log(LogLevel::kError, absl::StrCat(why, "; planning locally from step ", step,
                                     " without asking it again in this run"));
}

bool FallbackPolicy::MaybeBackUp(uint64_t step, bool probes_answered) {
  if (!service_down_ || refused_ || !probes_answered || step + 1 < down_since_step_ + hold_steps_) {
    return false;
  }
  service_down_ = false;
  ever_back_ = true;
  back_at_step_ = step + 1;
  Log(LogLevel::kInfo, absl::StrCat("rank ", rank_, ": the planner service at ", address_,
                                    " answers ", group_mode_ ? "rank 0" : "every rank",
                                    " again; asking it from step ", step + 1));
  return true;
}

void FallbackPolicy::CountLocalStep(uint64_t step) {
  ++local_steps_;
  // The 10th too: a short run hears of it again, not only at its first.
  if ((local_steps_ != 10 && local_steps_ % kLocalStepsWarning != 0) || rank_ != 0) return;
  Log(LogLevel::kWarning,
      absl::StrCat("rank 0: ", local_steps_, " steps planned locally so far, step ", step,
                   " included, although the planner service at ", address_,
                   " is configured (last reason: ", local_reason_,
                   "); set require_planner to make that an error"));
}

}  // namespace knapformer
