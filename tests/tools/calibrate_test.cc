// `knapformer calibrate`'s CSV: samples from "length,seconds" rows, and a
// precise error for rows no fit can use.
#include "tools/calibrate.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

TEST(ParseTimingCsv, NamesTheLineOfAMalformedRow) {
  auto samples = ParseTimingCsv("256,0.1\n512;0.2\n", 64);
  ASSERT_FALSE(samples.ok());
  EXPECT_THAT(std::string(samples.status().message()),
              HasSubstr("--input: line 2: expected \"length,seconds\", got \"512;0.2\""));
}

}  // namespace
}  // namespace knapformer
