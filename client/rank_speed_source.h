#ifndef KNAPFORMER_CLIENT_RANK_SPEED_SOURCE_H_
#define KNAPFORMER_CLIENT_RANK_SPEED_SOURCE_H_

// The speeds a PlannerClient plans with (planner/rank_speeds.h): the ones
// its options declare, or the ones every rank learns alike from the
// timings its group all-gather brings (planner/speed_learner.h). Apart
// from the client, which only asks it for them.

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "client/planner_client_options.h"
#include "client/rank_report.h"
#include "client/step_requests.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/speed_learner.h"

namespace knapformer {

class RankSpeedSource {
 public:
  // InvalidArgument unless the options give at most one of declared and
  // learned speeds, declared ones pass CheckRankSpeeds for `world_size`
  // ranks, and either comes with group mode (its all-gather brings every
  // rank's timing, its request carries the speeds).
  static absl::Status Check(const PlannerClientOptions& options, int world_size);

  // REQUIRES: Check(options, world_size) is OK.
  RankSpeedSource(const PlannerClientOptions& options, int world_size);

  bool learning() const { return learner_.has_value(); }
  // The speeds to plan with: learned, or declared (empty: one speed).
  std::vector<double> Speeds() const;

  // When learning: the ranks' timings in `gathered`, each with the work its
  // step's plan gave the rank (as `work` kept it), are a step of the
  // learner's, one per step they name.
  void Learn(const v1::StepSpec& spec, const Gathered& gathered, const GroupRequests& work);

 private:
  std::vector<double> declared_;
  std::optional<SpeedLearner> learner_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_RANK_SPEED_SOURCE_H_
