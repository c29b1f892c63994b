// A PlanGroup answer from a buggy or hostile service (any bytes), as every
// rank of a group-mode run takes it (the default mode's untrusted input):
// the first byte picks the lengths it answers (SeedLengths of an 8-rank
// g1n2+g2n1+g4n1 world), the rest is the PlanGroupResponse, whose job and
// step are set to the step's so that the table itself is tried. Each rank
// rebuilds the whole plan from the chunk table and its copy of every
// length, validated, and takes its slice: either every rank refuses the
// answer, or every rank's slice derives a route layout and the slices agree
// with each other (what per-rank mode's peers confirm). Nothing is read or
// written out of bounds (ASan), nothing overflows (UBSan).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "planner/plan_fingerprint.h"
#include "client/rank_report.h"
#include "client/route_layout.h"
#include "client/step_plan.h"
#include "google/protobuf/stubs/logging.h"
#include "knapformer/v1/planner.pb.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/seed_lengths.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size < 1) return 0;
  constexpr int32_t kRanks = 8;
  v1::StepSpec spec;
  spec.set_job_id("seed");
  spec.set_step(3);
  spec.set_world_size(kRanks);
  spec.set_topology("g1n2+g2n1+g4n1");
  spec.set_d_model(64);
  spec.set_gamma(0.5);
  Gathered gathered;
  gathered.lengths = SeedLengths(kRanks, data[0] & 3);
  v1::PlanGroupResponse response;
  if (!response.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  response.set_job_id(spec.job_id());
  response.set_step(spec.step());
  std::vector<PlanFingerprint> fingerprints;
  for (int32_t r = 0; r < kRanks; ++r) {
    absl::StatusOr<StepPlan> step = StepPlanOfGroupAnswer(spec, gathered, response, r);
    if (!step.ok()) {
      // Every rank decides from the same answer and the same lengths.
      fuzz::Require(r == 0, "every rank takes or refuses the answer alike");
      return 0;
    }
    const RankPlan& plan = step->plan;
    absl::StatusOr<RouteLayout> layout =
        DeriveRouteLayout(plan, gathered.lengths[r], r, kRanks, plan.ulysses.gpus,
                          plan.ulysses.first_rank);
    fuzz::Require(layout.ok(), "a validated plan's slice derives a route layout");
    fingerprints.push_back(FingerprintOf(plan, {}));
  }
  fuzz::Require(CheckFingerprints(fingerprints).ok(), "the slices of one validated plan agree");
  return 0;
}
