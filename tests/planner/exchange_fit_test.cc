// The link fit recovers known bandwidths and latencies from noisy synthetic
// all-to-all times, per link, and refuses data it cannot fit.
#include "planner/exchange_fit.h"

#include <limits>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

// Bags of 2, 4 and 8 GPUs, 1 KiB to 256 MiB per GPU, 5 repeats each.
std::vector<ExchangeSample> Synthetic(double bandwidth, double latency, bool inter_node,
                                      double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> jitter(0.0, noise);
  std::vector<ExchangeSample> samples;
  for (int32_t gpus : {2, 4, 8}) {
    for (double bytes = 1024; bytes <= 256.0 * (1 << 20); bytes *= 4) {
      for (int repeat = 0; repeat < 5; ++repeat) {
        const double sent = bytes * (gpus - 1) / gpus;
        samples.push_back(
            {gpus, bytes, (latency + sent / bandwidth) * (1 + jitter(rng)), inter_node});
      }
    }
  }
  return samples;
}

TEST(ExchangeFitTest, RecoversEachLinksBandwidthAndLatency) {
  std::vector<ExchangeSample> samples = Synthetic(380e9, 20e-6, false, 0.03, 1);
  const std::vector<ExchangeSample> inter = Synthetic(45e9, 60e-6, true, 0.03, 2);
  samples.insert(samples.end(), inter.begin(), inter.end());
  auto fit = FitExchanges(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(fit->intra_node.has_value() && fit->inter_node.has_value());
  // 3% noise per time, 150 times per link: each within 5%.
  EXPECT_NEAR(fit->intra_node->bytes_per_second, 380e9, 0.05 * 380e9);
  EXPECT_NEAR(fit->inter_node->bytes_per_second, 45e9, 0.05 * 45e9);
  EXPECT_NEAR(fit->intra_node->latency_seconds, 20e-6, 0.05 * 20e-6);
  EXPECT_NEAR(fit->inter_node->latency_seconds, 60e-6, 0.05 * 60e-6);
  EXPECT_EQ(fit->intra_node->samples, 150);
  EXPECT_GT(fit->inter_node->r_squared, 0.99);
  EXPECT_LT(fit->intra_node->max_relative_error, 0.15);  // 5 sigma

  // Exact data, one link only: exact, and the other link is not made up.
  auto exact = FitExchanges(Synthetic(2e9, 1e-4, false, 0.0, 3));
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_NEAR(exact->intra_node->bytes_per_second, 2e9, 1e-6 * 2e9);
  EXPECT_NEAR(exact->intra_node->latency_seconds, 1e-4, 1e-9);
  EXPECT_FALSE(exact->inter_node.has_value());
}

// The bandwidth is of the bytes that leave a GPU: a bag of 2 sends half its
// buffer, a bag of 8 seven eighths, so the same buffer takes longer in 8.
TEST(ExchangeFitTest, CountsOnlyTheBytesThatLeaveTheGpu) {
  const double bandwidth = 100e9;
  std::vector<ExchangeSample> samples;
  for (int32_t gpus : {2, 8}) {
    for (double bytes : {1e6, 1e8}) {
      samples.push_back({gpus, bytes, bytes * (gpus - 1) / gpus / bandwidth, false});
    }
  }
  auto fit = FitExchanges(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->intra_node->bytes_per_second, bandwidth, 1e-6 * bandwidth);
  EXPECT_NEAR(fit->intra_node->latency_seconds, 0.0, 1e-12);
}

// Times that are noise around a constant latency fit a negative latency
// first; the fit through the origin keeps a positive bandwidth and latency 0.
TEST(ExchangeFitTest, ANegativeLatencyIsRefittedThroughTheOrigin) {
  auto fit = FitExchanges({{2, 1e6, 1.0e-3, false}, {2, 2e6, 2.2e-3, false},
                           {2, 4e6, 4.6e-3, false}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->intra_node->latency_seconds, 0.0);
  EXPECT_GT(fit->intra_node->bytes_per_second, 0.0);
}

TEST(ExchangeFitTest, RefusesWhatItCannotFit) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const struct {
    std::vector<ExchangeSample> samples;
    absl::StatusCode code;
    const char* message;
  } cases[] = {
      {{}, absl::StatusCode::kInvalidArgument, "samples: none to fit"},
      {{{1, 1e6, 1e-3, false}}, absl::StatusCode::kInvalidArgument,
       "samples[0].gpus: 1 is outside [2, 65536]"},
      {{{2, 1e6, 1e-3, false}, {2, -1, 1e-3, false}}, absl::StatusCode::kInvalidArgument,
       "samples[1]: bytes and seconds must be finite and >= 0"},
      {{{2, 1e6, nan, false}}, absl::StatusCode::kInvalidArgument, "samples[0]"},
      {{{2, 1e6, 1e-3, true}, {4, 1e6 * 2 / 3, 2e-3, true}},  // both send 0.5 MB
       absl::StatusCode::kInvalidArgument,
       "inter-node: every sample sends the same bytes"},
      {{{2, 1e6, 2e-3, false}, {2, 1e8, 1e-3, false}}, absl::StatusCode::kFailedPrecondition,
       "intra-node: the times do not grow with the bytes sent"},
      {{{2, 1e6, 0, false}, {2, 1e8, 1e-3, false}}, absl::StatusCode::kInvalidArgument,
       "intra-node: a time of 0 seconds"},
  };
  for (const auto& c : cases) {
    auto fit = FitExchanges(c.samples);
    ASSERT_FALSE(fit.ok()) << c.message;
    EXPECT_EQ(fit.status().code(), c.code) << fit.status();
    EXPECT_THAT(std::string(fit.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace knapformer
