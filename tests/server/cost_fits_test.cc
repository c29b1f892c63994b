#include "server/cost_fits.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/calibration.h"
#include "server/service_limits.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

v1::StepSpec Spec(uint64_t step, const std::string& job_id = "job",
                  const std::string& group_id = "", uint64_t incarnation = 0) {
  v1::StepSpec spec;
  spec.set_job_id(job_id);
  spec.set_group_id(group_id);
  spec.set_incarnation(incarnation);
  spec.set_step(step);
  spec.set_world_size(4);
  spec.set_d_model(1024);
  spec.set_gamma(0.49);
  return spec;
}

// Per-rank work of a 4-rank plan whose two terms vary independently over the
// ranks, so four timings determine k and gamma.
std::vector<WorkSample> DistinctWork(double scale) {
  std::vector<WorkSample> work(4);
  for (int r = 0; r < 4; ++r) {
    work[r].linear = scale * 1e9 * (r + 1);
    work[r].attention = scale * 1e8 * (r + 1) * (r + 1);
  }
  return work;
}

// What a rank that did `work` measures at `gamma` and 1e-12 s per unit,
// times `noise` (so that a fit is not exact).
double Seconds(const WorkSample& work, double gamma, double noise = 1.0) {
  return 1e-12 * (work.linear + gamma * work.attention) * noise;
}

v1::StepTiming Timing(uint64_t step, const WorkSample& work, double gamma, double noise = 1.0) {
  v1::StepTiming timing;
  timing.set_step(step);
  timing.set_compute_seconds(Seconds(work, gamma, noise));
  return timing;
}

// The same, carrying the work of the plan the rank ran.
v1::StepTiming Carrying(uint64_t step, const WorkSample& work, double gamma) {
  v1::StepTiming timing = Timing(step, work, gamma);
  timing.set_linear_work(work.linear);
  timing.set_attention_work(work.attention);
  return timing;
}

// The sample a timing of `work` gives.
WorkSample Sample(const WorkSample& work, double seconds) {
  return WorkSample{work.linear, work.attention, seconds};
}

// Exactly equal: the store fits the same samples in the same order.
void ExpectSameFit(const CostFit& got, const CostFit& want) {
  EXPECT_EQ(got.k, want.k);
  EXPECT_EQ(got.gamma, want.gamma);
  EXPECT_EQ(got.samples, want.samples);
  EXPECT_EQ(got.rmse_seconds, want.rmse_seconds);
  EXPECT_EQ(got.r_squared, want.r_squared);
  EXPECT_EQ(got.max_relative_error, want.max_relative_error);
}

constexpr char kNoTimings[] = "no timings of this job yet (record_compute_seconds on every rank)";

TEST(CostFitsTest, AFitAppearsAfterEnoughTimingsAndIsCalibrationsFit) {
  ServiceLimits limits;
  limits.min_timing_samples = 8;
  CostFits fits{limits};
  std::string note;
  EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
  EXPECT_EQ(note, "no timings of this job yet");  // not even a job
  fits.AddGroup("job", "", 0);
  EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
  EXPECT_EQ(note, kNoTimings);
  EXPECT_FALSE(fits.WantsWork("job"));

  std::vector<WorkSample> samples;
  for (uint64_t step = 0; step < 2; ++step) {
    const std::vector<WorkSample> work = DistinctWork(step + 1);
    fits.RecordPlanned(Spec(step), work);
    for (int32_t rank = 0; rank < 4; ++rank) {
      const double noise = 1 + 0.01 * ((3 * rank + 5 * static_cast<int>(step)) % 5 - 2);
      fits.AddTiming(Spec(step + 1), rank, Timing(step, work[rank], 2.0, noise));
      samples.push_back(Sample(work[rank], Seconds(work[rank], 2.0, noise)));
    }
    EXPECT_TRUE(fits.WantsWork("job"));
    if (step == 0) {
      EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
      EXPECT_EQ(note,
                "4 timing samples, the fit needs 8 (every rank's record_compute_seconds, one "
                "per step)");
      EXPECT_THAT(fits.FittedGammas(), IsEmpty());
    }
  }
  absl::StatusOr<CostFit> want = FitCostModel(samples);
  ASSERT_TRUE(want.ok()) << want.status();
  std::optional<CostFit> fit = fits.FittedCost("job", &note);
  ASSERT_TRUE(fit.has_value()) << note;
  EXPECT_EQ(note, "");
  ExpectSameFit(*fit, *want);
  EXPECT_EQ(fit->samples, 8);
  // The times' 1-2% noise moves gamma by about a tenth: the fit is computed,
  // not echoed.
  EXPECT_NEAR(fit->gamma, 2.0, 0.3);
  EXPECT_GT(std::abs(fit->gamma - 2.0), 1e-3);
  EXPECT_THAT(fits.FittedGammas(), ElementsAre(Pair("job", want->gamma)));
}

// A rank at 0.6 of its peers' speed times 1/0.6 of the model: given its
// normalized speed (PlanGroupRequest.rank_speeds), its timings count as a
// GPU at speed 1 would have timed them, and gamma is fitted as with no
// slow rank; without it, gamma is biased.
TEST(CostFitsTest, TimingsAtSpeedOneKeepASlowRankFromBiasingGamma) {
  const std::vector<double> normalized = {1 / 0.9, 1 / 0.9, 0.6 / 0.9, 1 / 0.9};  // mean 1
  // The same noisy timings: rank 2 at 0.6 (or not), the speeds given (or not).
  auto fitted_gamma = [&](bool slow_rank, bool with_speeds) {
    ServiceLimits limits;
    limits.min_timing_samples = 8;
    CostFits fits{limits};
    fits.AddGroup("job", "", 0);
    for (uint64_t step = 0; step < 6; ++step) {
      const std::vector<WorkSample> work = DistinctWork(step + 1);
      fits.RecordPlanned(Spec(step), work);
      for (int32_t rank = 0; rank < 4; ++rank) {
        const double noise = 1 + 0.01 * ((3 * rank + 5 * static_cast<int>(step)) % 5 - 2);
        const double speed = slow_rank && rank == 2 ? 0.6 : 1.0;
        v1::StepTiming timing = Timing(step, work[rank], 2.0, noise / speed);
        // Seconds x the normalized speed: the healthy ranks' 1/0.9 scales k
        // alone, whatever it is.
        fits.AddTiming(Spec(step + 1), rank, timing, with_speeds ? normalized[rank] : 1.0);
      }
    }
    std::optional<CostFit> fit = fits.FittedCost("job");
    EXPECT_TRUE(fit.has_value());
    return fit.has_value() ? fit->gamma : 0.0;
  };
  const double none = fitted_gamma(false, false);
  const double corrected = fitted_gamma(true, true);
  const double biased = fitted_gamma(true, false);
  EXPECT_NEAR(corrected, none, 0.05 * none);
  EXPECT_GT(std::abs(biased - none), 0.2 * none) << biased << " vs " << none;
}

// The exported gamma keeps up once per planned step: RecordPlanned refits.
TEST(CostFitsTest, RecordPlannedRefitsForTheExportedGamma) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  const std::vector<WorkSample> work = DistinctWork(1);
  fits.RecordPlanned(Spec(0), work);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(1), rank, Timing(0, work[rank], 3.0));
  }
  EXPECT_THAT(fits.FittedGammas(), IsEmpty());  // no refit yet
  fits.RecordPlanned(Spec(1), {});
  ASSERT_EQ(fits.FittedGammas().size(), 1u);
  EXPECT_NEAR(fits.FittedGammas().at("job"), 3.0, 1e-6);
}

TEST(CostFitsTest, ARetriedTimingOfTheSameStepAndRankCountsOnce) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  for (uint64_t step = 0; step < 2; ++step) {
    const std::vector<WorkSample> work = DistinctWork(step + 1);
    fits.RecordPlanned(Spec(step), work);
    for (int32_t rank = 0; rank < 4; ++rank) {
      fits.AddTiming(Spec(step + 1), rank, Timing(step, work[rank], 2.0));
    }
  }
  std::optional<CostFit> fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 8);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);

  // The same (step, rank) again, as a retried request would send it, with a
  // time that would pull gamma far off if it counted; carrying its work or not.
  fits.AddTiming(Spec(2), 1, Timing(1, DistinctWork(2)[1], 50.0));
  fits.AddTiming(Spec(2), 1, Carrying(1, DistinctWork(2)[1], 50.0));
  fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 8);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);
  EXPECT_EQ(fits.usage().samples, 8);
}

// A timing that carries its step's work (a step another replica, or the
// client, planned) is a sample here too, once per (step, rank), and its
// work is the one counted, before that of this server's own plan of the
// step; one that carries none for a step planned elsewhere is no sample.
TEST(CostFitsTest, ATimingsCarriedWorkIsUsedBeforeTheServersOwnPlans) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);  // this replica planned nothing
  const std::vector<WorkSample> work = DistinctWork(1);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(5), rank, Timing(4, work[rank], 2.0));  // no work: no sample
  }
  EXPECT_FALSE(fits.FittedCost("job").has_value());
  EXPECT_EQ(fits.usage().samples, 0);
  std::vector<WorkSample> samples;
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(5), rank, Carrying(3, work[rank], 2.0));
    samples.push_back(Sample(work[rank], Seconds(work[rank], 2.0)));
  }
  std::optional<CostFit> fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 4);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);

  // Sent again (a retried request), with a time that would pull gamma off.
  fits.AddTiming(Spec(5), 2, Carrying(3, work[2], 50.0));
  EXPECT_EQ(fits.FittedCost("job")->samples, 4);
  // A rank outside the world is no sample.
  fits.AddTiming(Spec(5), 4, Carrying(3, work[1], 2.0));
  EXPECT_EQ(fits.FittedCost("job")->samples, 4);

  // Where this replica planned the step too, the carried work counts: its
  // own plan may not be the one the ranks ran (answered after the client
  // gave up on it). The times fit gamma 2 with the carried work only.
  std::vector<WorkSample> unused(4);  // another balance of linear and attention
  for (int r = 0; r < 4; ++r) unused[r] = {1e9 * (4 - r), 1e8 * (r + 1), 0};
  const std::vector<WorkSample> ran = DistinctWork(3);
  fits.RecordPlanned(Spec(6), unused);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(7), rank, Carrying(6, ran[rank], 2.0));
    samples.push_back(Sample(ran[rank], Seconds(ran[rank], 2.0)));
  }
  fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  ExpectSameFit(*fit, *FitCostModel(samples));
  EXPECT_EQ(fit->samples, 8);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);
  // Without carried work, its own plan's work pairs with the time, once.
  const std::vector<WorkSample> own = DistinctWork(5);
  fits.RecordPlanned(Spec(8), own);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(9), rank, Timing(8, own[rank], 2.0));
    samples.push_back(Sample(own[rank], Seconds(own[rank], 2.0)));
    fits.AddTiming(Spec(9), rank, Carrying(8, own[rank], 50.0));  // a retry: ignored
  }
  fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  ExpectSameFit(*fit, *FitCostModel(samples));
  EXPECT_EQ(fit->samples, 12);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);
}

// A measured-model job's step of rank r: one sequence's worth of attention
// on one of four grid points, with work and time as the transformer model
// at gamma 0.49 gives them, so the table fitted is gamma*4*d*pairs.
struct TableStep {
  std::vector<WorkSample> work;
  std::vector<PairWeights> weights;
};
TableStep MeasuredStep(uint64_t step) {
  constexpr double kD = 1024;  // Spec's d_model
  TableStep planned;
  for (int r = 0; r < 4; ++r) {
    const int point = 3 + static_cast<int>((step + r) % 4);
    const double share = 1.0 + r;
    PairWeights weights{};
    weights[point] = static_cast<float>(share);
    planned.weights.push_back(weights);
    const double linear = 1e9 * (r + 1) * (1 + step % 3);
    planned.work.push_back({linear, 4 * kD * share * PairGridPoint(point), 0});
  }
  return planned;
}

TEST(CostFitsTest, AMeasuredJobsTimedStepsFitItsTableWhenTheRanksRanThisServersPlan) {
  ServiceLimits limits;
  limits.min_timing_samples = 8;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  std::string note;
  EXPECT_FALSE(fits.FittedTable("job", &note).has_value());
  EXPECT_THAT(note, ::testing::HasSubstr("no timed steps of this job for its table yet"));
  // A timing carrying work that is not this server's plan's (the ranks ran
  // another plan) counts for gamma, not for the table.
  for (uint64_t step = 0; step < 12; ++step) {
    const TableStep planned = MeasuredStep(step);
    fits.RecordPlanned(Spec(step), planned.work, planned.weights);
    for (int32_t rank = 0; rank < 4; ++rank) {
      WorkSample other = planned.work[rank];
      other.linear *= 2;
      fits.AddTiming(Spec(step + 1), rank, Carrying(step, other, 0.49));
    }
  }
  ASSERT_TRUE(fits.FittedCost("job").has_value());
  EXPECT_FALSE(fits.FittedTable("job").has_value());
  // Timings carrying this server's plan's work (group mode), and timings
  // carrying none (per-rank mode), are samples of the table.
  for (uint64_t step = 20; step < 26; ++step) {
    const TableStep planned = MeasuredStep(step);
    fits.RecordPlanned(Spec(step), planned.work, planned.weights);
    for (int32_t rank = 0; rank < 4; ++rank) {
      fits.AddTiming(Spec(step + 1), rank,
                     step % 2 == 0 ? Carrying(step, planned.work[rank], 0.49)
                                   : Timing(step, planned.work[rank], 0.49));
    }
  }
  std::optional<MeasuredAttention> table = fits.FittedTable("job", &note);
  ASSERT_TRUE(table.has_value()) << note;
  EXPECT_EQ(note, "");
  const CostFit fit = *fits.FittedCost("job");
  EXPECT_NEAR(fit.gamma, 0.49, 1e-6);
  ASSERT_EQ(table->pairs().size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(table->pairs()[i], PairGridPoint(3 + static_cast<int>(i)));
    const double want = 0.49 * 4 * 1024 * table->pairs()[i];
    EXPECT_NEAR(table->work()[i], want, 1e-4 * want) << "point " << i;
  }
  // A timing of a step this server did not plan (another replica did)
  // is a sample of the table when it carries the rank's grid weights.
  const int64_t samples = fits.usage().samples;
  const TableStep elsewhere = MeasuredStep(40);
  for (int32_t rank = 0; rank < 4; ++rank) {
    v1::StepTiming timing = Carrying(40, elsewhere.work[rank], 0.49);
    if (rank < 2) {
      timing.mutable_attention_by_pair_point()->Add(elsewhere.weights[rank].begin(),
                                                    elsewhere.weights[rank].end());
    }
    fits.AddTiming(Spec(41), rank, timing);
  }
  EXPECT_EQ(fits.usage().samples, samples + 4 + 2);  // 4 for gamma, 2 for the table
  ASSERT_TRUE(fits.FittedTable("job", &note).has_value());
  EXPECT_EQ(note, "");

  // A job planned without grid weights (any other model) has no table.
  fits.AddGroup("plain", "", 0);
  const TableStep planned = MeasuredStep(0);
  fits.RecordPlanned(Spec(0, "plain"), planned.work);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(1, "plain"), rank, Timing(0, planned.work[rank], 0.49));
  }
  EXPECT_FALSE(fits.FittedTable("plain").has_value());
}

// A timing of a step whose work is no longer kept (more than timed_steps
// planned steps ago) or was never known, and carries none, is no sample;
// nor is any timing of a group or job not added.
TEST(CostFitsTest, ATimingOfAStepTooOldOrUnknownIsIgnored) {
  ServiceLimits limits;
  limits.timed_steps = 2;
  limits.min_timing_samples = 2;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  for (uint64_t step = 0; step < 3; ++step) fits.RecordPlanned(Spec(step), DistinctWork(step + 1));
  EXPECT_EQ(fits.usage().planned_steps, 2);

  fits.AddTiming(Spec(3), 0, Timing(0, DistinctWork(1)[0], 2.0));  // step 0: too old
  EXPECT_EQ(fits.usage().samples, 0);
  EXPECT_TRUE(fits.WantsWork("job"));  // a timing came, though it was no sample
  fits.AddTiming(Spec(3), 0, Timing(9, DistinctWork(1)[0], 2.0));  // step 9: never planned
  EXPECT_EQ(fits.usage().samples, 0);
  fits.AddTiming(Spec(3), 0, Timing(1, DistinctWork(2)[0], 2.0));  // step 1: kept
  EXPECT_EQ(fits.usage().samples, 1);

  // Groups and jobs not added: nothing, not even with the work carried.
  fits.AddTiming(Spec(3, "job", "other"), 1, Carrying(2, DistinctWork(3)[1], 2.0));
  fits.AddTiming(Spec(3, "job", "", 1), 1, Carrying(2, DistinctWork(3)[1], 2.0));
  fits.AddTiming(Spec(3, "stranger"), 1, Carrying(2, DistinctWork(3)[1], 2.0));
  EXPECT_FALSE(fits.WantsWork("stranger"));
  fits.RecordPlanned(Spec(3, "stranger"), DistinctWork(1));
  const CostFits::Usage usage = fits.usage();
  EXPECT_EQ(usage.jobs, 1);
  EXPECT_EQ(usage.groups, 1);
  EXPECT_EQ(usage.planned_steps, 2);
  EXPECT_EQ(usage.samples, 1);
}

TEST(CostFitsTest, AFailedRefitKeepsTheLastGoodFitWithTheNote) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  limits.timing_window = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  // Every rank gets the same work: a window of four equal samples cannot
  // tell the terms apart, and the refit fails.
  const std::vector<WorkSample> distinct = DistinctWork(1);
  const std::vector<WorkSample> same(4, distinct[2]);
  const absl::Status cannot = FitCostModel({same.begin(), same.end()}).status();
  ASSERT_FALSE(cannot.ok());

  // Failing with no fit yet: none, and why.
  fits.RecordPlanned(Spec(0), same);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(1), rank, Timing(0, same[rank], 7.0));
  }
  std::string note;
  EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
  EXPECT_EQ(note, absl::StrCat("the fit of 4 timing samples failed: ", cannot.message()));

  fits.RecordPlanned(Spec(1), distinct);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(2), rank, Timing(1, distinct[rank], 2.0));
  }
  std::optional<CostFit> good = fits.FittedCost("job", &note);
  ASSERT_TRUE(good.has_value()) << note;
  EXPECT_EQ(note, "");
  EXPECT_NEAR(good->gamma, 2.0, 1e-6);

  fits.RecordPlanned(Spec(2), same);
  for (int32_t rank = 0; rank < 4; ++rank) {
    fits.AddTiming(Spec(3), rank, Timing(2, same[rank], 7.0));
  }
  std::optional<CostFit> fit = fits.FittedCost("job", &note);
  ASSERT_TRUE(fit.has_value());
  ExpectSameFit(*fit, *good);
  EXPECT_EQ(fit->samples, 4);
  EXPECT_EQ(note, absl::StrCat("the fit of 4 timing samples failed: ", cannot.message(),
                               " (the previous fit is used)"));
  EXPECT_THAT(fits.FittedGammas(), ElementsAre(Pair("job", good->gamma)));
}

// A job forgotten (idle, evicted) takes its timings and fit along; a group
// incarnation forgotten (replaced by a newer one) its planned work only.
TEST(CostFitsTest, ForgettingAJobForgetsItsFitAndAGroupItsWork) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  fits.AddGroup("other", "", 0);
  const std::vector<WorkSample> work = DistinctWork(1);
  for (const char* job : {"job", "other"}) {
    fits.RecordPlanned(Spec(0, job), work);
    for (int32_t rank = 0; rank < 4; ++rank) {
      fits.AddTiming(Spec(1, job), rank, Timing(0, work[rank], 2.0));
    }
    ASSERT_TRUE(fits.FittedCost(job).has_value());
  }
  fits.RecordPlanned(Spec(1), work);  // planned, not yet timed

  // A new incarnation replaces the group: the old one's work goes, the fit stays.
  fits.ForgetGroup("job", "", 0);
  fits.AddGroup("job", "", 7);
  fits.AddTiming(Spec(2, "job", "", 7), 0, Timing(1, work[0], 50.0));  // its work is gone
  fits.AddTiming(Spec(2), 0, Timing(1, work[0], 50.0));                // and so is the group
  std::optional<CostFit> fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 4);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);
  EXPECT_TRUE(fits.WantsWork("job"));

  fits.ForgetJob("job");
  std::string note;
  EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
  EXPECT_EQ(note, "no timings of this job yet");
  EXPECT_FALSE(fits.WantsWork("job"));
  EXPECT_THAT(fits.FittedGammas(), ElementsAre(Pair("other", fits.FittedCost("other")->gamma)));
  CostFits::Usage usage = fits.usage();
  EXPECT_EQ(usage.jobs, 1);
  EXPECT_EQ(usage.groups, 1);
  EXPECT_EQ(usage.planned_steps, 1);
  EXPECT_EQ(usage.samples, 4);

  // The job again, as new: nothing of its past.
  fits.AddGroup("job", "", 7);
  EXPECT_FALSE(fits.FittedCost("job", &note).has_value());
  EXPECT_EQ(note, kNoTimings);
  EXPECT_FALSE(fits.WantsWork("job"));
  fits.ForgetJob("other");
  fits.ForgetJob("never-added");
  usage = fits.usage();
  EXPECT_EQ(usage.jobs, 1);
  EXPECT_EQ(usage.groups, 1);
  EXPECT_EQ(usage.planned_steps, 0);
  EXPECT_EQ(usage.samples, 0);
  EXPECT_THAT(fits.FittedGammas(), IsEmpty());
}

// Per group incarnation at most timed_steps steps' work (the server's plans'
// and the timings' carried steps' alike), per job at most timing_window
// samples, the most recent ones, which the fit is made of.
TEST(CostFitsTest, MemoryStaysBoundedByTheLimits) {
  ServiceLimits limits;
  limits.timed_steps = 3;
  limits.timing_window = 10;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "a", 0);
  fits.AddGroup("job", "b", 0);
  std::vector<WorkSample> samples;
  for (uint64_t step = 0; step < 20; ++step) {
    const std::vector<WorkSample> work = DistinctWork(1 + step % 3);
    fits.RecordPlanned(Spec(step, "job", "a"), work);
    for (int32_t rank = 0; rank < 4; ++rank) {
      const double noise = 1 + 0.01 * ((rank + static_cast<int>(step)) % 3 - 1);
      fits.AddTiming(Spec(step + 1, "job", "a"), rank, Timing(step, work[rank], 2.0, noise));
      samples.push_back(Sample(work[rank], Seconds(work[rank], 2.0, noise)));
    }
    // Group b's steps are planned elsewhere: its timings carry their work.
    fits.AddTiming(Spec(step + 1, "job", "b"), 0, Carrying(step, work[0], 2.0));
    samples.push_back(Sample(work[0], Seconds(work[0], 2.0)));
    const CostFits::Usage usage = fits.usage();
    EXPECT_LE(usage.planned_steps, 2 * limits.timed_steps) << "step " << step;
    EXPECT_LE(usage.samples, limits.timing_window) << "step " << step;
  }
  const CostFits::Usage usage = fits.usage();
  EXPECT_EQ(usage.jobs, 1);
  EXPECT_EQ(usage.groups, 2);
  EXPECT_EQ(usage.planned_steps, 6);
  EXPECT_EQ(usage.samples, 10);
  std::optional<CostFit> fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  ExpectSameFit(*fit, *FitCostModel({samples.end() - 10, samples.end()}));

  // Nothing is kept per step with timed_steps 0, and so no timing is a sample.
  limits.timed_steps = 0;
  CostFits none{limits};
  none.AddGroup("job", "", 0);
  none.RecordPlanned(Spec(0), DistinctWork(1));
  none.AddTiming(Spec(1), 0, Timing(0, DistinctWork(1)[0], 2.0));
  none.AddTiming(Spec(1), 1, Carrying(0, DistinctWork(1)[1], 2.0));
  EXPECT_EQ(none.usage().planned_steps, 0);
  EXPECT_EQ(none.usage().samples, 0);
}

// Ranks timing, a solver planning and fitting, and the metrics reading, all
// at once: each (step, rank) counts once (run under TSan for the locking).
TEST(CostFitsTest, ConcurrentCallersCountEachTimingOnce) {
  ServiceLimits limits;
  limits.min_timing_samples = 4;
  CostFits fits{limits};
  fits.AddGroup("job", "", 0);
  constexpr int kSteps = 8;
  for (uint64_t step = 0; step < kSteps; ++step) fits.RecordPlanned(Spec(step), DistinctWork(1));
  std::vector<std::thread> threads;
  for (int32_t rank = 0; rank < 4; ++rank) {
    threads.emplace_back([&fits, rank] {
      for (int repeat = 0; repeat < 3; ++repeat) {  // every timing sent thrice
        for (uint64_t step = 0; step < kSteps; ++step) {
          fits.AddTiming(Spec(step + 1), rank, Timing(step, DistinctWork(1)[rank], 2.0));
        }
      }
    });
  }
  threads.emplace_back([&fits] {
    for (int i = 0; i < 50; ++i) {
      fits.FittedCost("job");
      fits.FittedGammas();
      fits.WantsWork("job");
      fits.usage();
    }
  });
  for (std::thread& thread : threads) thread.join();
  std::optional<CostFit> fit = fits.FittedCost("job");
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->samples, 4 * kSteps);
  EXPECT_NEAR(fit->gamma, 2.0, 1e-6);
}

}  // namespace
}  // namespace knapformer
