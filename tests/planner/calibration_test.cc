// The cost-model fit recovers known k and gamma from noisy synthetic data,
// and refuses data it cannot fit.
#include "planner/calibration.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

std::vector<WorkSample> Synthetic(double k, double gamma, int64_t d, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, noise);
  std::vector<WorkSample> samples;
  for (int64_t length = 256; length <= 32768; length *= 2) {
    for (int repeat = 0; repeat < 10; ++repeat) {
      WorkSample s = SequenceSample(length, d, 0);
      s.seconds = k * (s.linear + gamma * s.attention) * (1 + jitter(rng));
      samples.push_back(s);
    }
  }
  return samples;
}

TEST(CalibrationTest, RecoversAKnownGammaFromNoisyTimes) {
  for (const double gamma : {0.2, 0.49, 1.3}) {
    const double k = 2.5e-15;  // seconds per cost unit
    auto fit = FitCostModel(Synthetic(k, gamma, 3072, 0.03, 7));
    ASSERT_TRUE(fit.ok()) << fit.status();
    // 3% noise per time, 80 times: gamma to within 5%, k to within 2%.
    EXPECT_NEAR(fit->gamma, gamma, 0.05 * gamma) << "gamma " << gamma;
    EXPECT_NEAR(fit->k, k, 0.02 * k);
    EXPECT_EQ(fit->samples, 80);
    EXPECT_GT(fit->r_squared, 0.99);
    EXPECT_LT(fit->max_relative_error, 0.15);  // 3% noise, 5 sigma
  }
  // Exact data: an exact fit.
  auto exact = FitCostModel(Synthetic(1e-12, 0.49, 64, 0.0, 1));
  ASSERT_TRUE(exact.ok());
  EXPECT_NEAR(exact->gamma, 0.49, 1e-9);
  EXPECT_NEAR(exact->max_relative_error, 0.0, 1e-9);
}

TEST(CalibrationTest, FitsKAloneAtAGivenGamma) {
  const double k = 2.5e-15;
  auto fit = FitCostScale(Synthetic(k, 0.49, 3072, 0.0, 1), 0.49);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->k, k, 1e-9 * k);
  EXPECT_DOUBLE_EQ(fit->gamma, 0.49);
  EXPECT_NEAR(fit->max_relative_error, 0.0, 1e-9);
  // Times that fall as sequences grow defeat the two-term fit, not k alone.
  std::vector<WorkSample> falling = {SequenceSample(256, 64, 2e-3), SequenceSample(512, 64, 3e-3),
                                     SequenceSample(1024, 64, 1e-3)};
  EXPECT_FALSE(FitCostModel(falling).ok());
  auto scale = FitCostScale(falling, 0.5);
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_GT(scale->k, 0.0);
  EXPECT_THAT(std::string(FitCostScale({}, 0.5).status().message()),
              ::testing::HasSubstr("need at least 1"));
  EXPECT_THAT(std::string(FitCostScale(falling, -1).status().message()),
              ::testing::HasSubstr("gamma: must be a finite number >= 0"));
}

TEST(CalibrationTest, RefusesWhatItCannotFit) {
  EXPECT_EQ(FitCostModel({SequenceSample(512, 64, 1.0)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // One length only: the two terms cannot be told apart.
  auto single = FitCostModel({SequenceSample(512, 64, 1.0), SequenceSample(512, 64, 1.1)});
  EXPECT_EQ(single.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(single.status().message()), ::testing::HasSubstr("two different lengths"));
  // Times that fall as sequences grow.
  auto falling = FitCostModel({SequenceSample(256, 64, 2.0), SequenceSample(4096, 64, 1.0),
                               SequenceSample(65536, 64, 0.5)});
  EXPECT_EQ(falling.status().code(), absl::StatusCode::kFailedPrecondition);
  WorkSample bad = SequenceSample(256, 64, -1.0);
  EXPECT_EQ(FitCostModel({bad, SequenceSample(512, 64, 1.0)}).status().message(),
            "samples[0]: values must be finite and >= 0");
}

}  // namespace
}  // namespace knapformer
