// `knapformer calibrate`'s CSV: samples from "length,seconds" rows, and a
// precise error for rows no fit can use.
#include "tools/calibrate.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/attention_mask.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(ParseTimingCsv, ReadsRowsAndSkipsTheHeaderAndComments) {
  auto samples = ParseTimingCsv("length,seconds\n# block timings\n1024, 0.0011\n2048,0.0024\n", 64);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_DOUBLE_EQ((*samples)[0].seconds, 0.0011);
  EXPECT_DOUBLE_EQ((*samples)[1].seconds, 0.0024);
  EXPECT_GT((*samples)[1].linear, (*samples)[0].linear);
}

TEST(ParseTimingCsv, RefusesTimesNoFitCanUse) {
  // Found by timing_csv_fuzzer: "2e9400" parsed as an infinite time and
  // went into the fit.
  for (const char* row : {"512,2e9400", "512,inf", "512,nan", "512,-0.5"}) {
    auto samples = ParseTimingCsv(std::string("256,0.1\n") + row + "\n", 64);
    ASSERT_FALSE(samples.ok()) << row;
    EXPECT_EQ(samples.status().code(), absl::StatusCode::kInvalidArgument) << row;
    EXPECT_THAT(std::string(samples.status().message()),
                HasSubstr("--input: line 2: length must be in [1, "))
        << row;
    EXPECT_THAT(std::string(samples.status().message()), HasSubstr("seconds finite and >= 0"));
  }
}

// Rows timed under masks fit gamma against the pairs attended: times made
// by k * (24*l*d^2 + gamma*4*A*d) give back that gamma, and read as full
// attention they do not.
TEST(ParseTimingCsv, RowsNamingAMaskFitAgainstThePairsAttended) {
  constexpr double kK = 1e-12, kGamma = 0.4;
  constexpr int64_t kD = 64;
  std::string masked, blind;
  for (int64_t l : {256, 512, 1024, 2048, 4096, 8192}) {
    for (const char* mask : {"causal", "window=300", "spans=64:f;64:c;128:f"}) {
      auto parsed = ParseMaskText(mask, "m");
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      if (parsed->kind == AttentionMask::Kind::kSpans) {
        parsed->spans.back().length = l - 128;  // spans add up to l
      }
      const double pairs = AttendedPairs(l, *parsed);
      const double seconds = kK * (24.0 * l * kD * kD + kGamma * 4 * pairs * kD);
      masked += absl::StrCat(l, ",", seconds, ",", MaskText(*parsed), "\n");
      blind += absl::StrCat(l, ",", seconds, "\n");
    }
  }
  auto samples = ParseTimingCsv("length,seconds,mask\n" + masked, kD);
  ASSERT_TRUE(samples.ok()) << samples.status();
  auto fit = FitCostModel(*samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->gamma, kGamma, 1e-6);
  auto blind_fit = FitCostModel(*ParseTimingCsv(blind, kD));
  ASSERT_TRUE(blind_fit.ok());
  EXPECT_LT(blind_fit->gamma, 0.8 * kGamma);  // l^2 overstates the masked work

  for (const auto& [row, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"512,0.1,diagonal", "mask: unknown mask 'diagonal'"},
           {"512,0.1,window=0", "mask: 'window=0': the window must be a whole number"},
           {"512,0.1,spans=500:f;11:c", "mask.spans: lengths add up to 511"},
           {"512,0.1,spans=512:x", "mask: span '512:x' of 'spans=512:x' is not n:f or n:c"}}) {
    auto bad = ParseTimingCsv("256,0.1\n" + row + "\n", kD);
    ASSERT_FALSE(bad.ok()) << row;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--input: line 2: " + message))
        << row;
  }
}

TEST(ParseTimingCsv, NamesTheLineOfAMalformedRow) {
  auto samples = ParseTimingCsv("256,0.1\n512;0.2\n", 64);
  ASSERT_FALSE(samples.ok());
  EXPECT_THAT(std::string(samples.status().message()),
              HasSubstr("--input: line 2: expected \"length,seconds[,mask]\", got \"512;0.2\""));
}

}  // namespace
}  // namespace knapformer
