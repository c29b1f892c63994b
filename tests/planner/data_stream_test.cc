#include "planner/data_stream.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

int64_t Tokens(const std::string& code) {
  auto codes = ParseDataCodes(code);
  EXPECT_TRUE(codes.ok()) << codes.status();
  return (*codes)[0].VisualTokens();
}

TEST(DataCodeTest, VisualTokensFollowThePaper) {
  EXPECT_EQ(Tokens("g1b1i256f1s0"), 256);
  EXPECT_EQ(Tokens("g1b1i512f1s0"), 1024);
  EXPECT_EQ(Tokens("g1b1i1024f1s0"), 4096);
  EXPECT_EQ(Tokens("g1b1i2048f1s0"), 16384);
  EXPECT_EQ(Tokens("g1b1i256f85s1"), 6400);    // int(85 / 3.4) = 25 frames
  EXPECT_EQ(Tokens("g1b1i256f4s0"), 1024);     // no compression: 4 frames
  EXPECT_EQ(Tokens("g1b1i256f2s1"), 256);      // max(int(2 / 3.4), 1) = 1
  EXPECT_EQ(Tokens("g1b1i300f1s0"), 18 * 18);  // floor(300 / 16) = 18
}

TEST(DataCodeTest, ParsesListsAndRoundTrips) {
  auto codes = ParseDataCodes(ScenarioCodes("mixed-res"));
  ASSERT_TRUE(codes.ok()) << codes.status();
  ASSERT_EQ(codes->size(), 4u);
  EXPECT_EQ((*codes)[3].ToString(), "g8b1i2048f1s0");
  EXPECT_EQ((*codes)[0].gpus + (*codes)[1].gpus + (*codes)[2].gpus + (*codes)[3].gpus, 32);
  for (const std::string& name : ScenarioNames()) {
    EXPECT_TRUE(ParseDataCodes(ScenarioCodes(name)).ok()) << name;
  }
  EXPECT_EQ(ScenarioCodes("nope"), "");
}

TEST(DataCodeTest, RejectsMalformedCodesNamingThem) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "data: empty"},
      {"g1b1i256f1s2", "'g1b1i256f1s2': s exceeds the limit of 1"},
      {"g1b1i256f1", "'g1b1i256f1': expected 's'"},
      {"g1b1i256f1s0x", "unexpected trailing 'x'"},
      {"g0b1i256f1s0", "g must be at least 1"},
      {"g1b1i8f1s0", "i must be at least 16"},
      {"g1b1i256f1s0,", "empty code"},
      {"b1g1i256f1s0", "expected 'g'"},
      {"g1b1i99999999f1s0", "i exceeds the limit"},
  };
  for (const auto& [code, message] : cases) {
    auto parsed = ParseDataCodes(code);
    ASSERT_FALSE(parsed.ok()) << code;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(message)) << code;
  }
}

TEST(DataStreamTest, LaysCodesOutOnContiguousRanksAndRepeatsTheBlock) {
  auto stream = DataStream::Create(*ParseDataCodes("g2b3i256f1s0,g1b1i2048f1s0"), 6, 7);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const RankLengths batch = stream->Batch(0);
  ASSERT_EQ(batch.size(), 6u);
  for (int r : {0, 1, 3, 4}) {
    ASSERT_EQ(batch[r].size(), 3u) << r;
    for (int64_t l : batch[r]) {
      EXPECT_GE(l, static_cast<int64_t>(256 * 0.96));
      EXPECT_LE(l, static_cast<int64_t>(256 * 1.04) + 392);
    }
  }
  for (int r : {2, 5}) {
    ASSERT_EQ(batch[r].size(), 1u) << r;
    EXPECT_GE(batch[r][0], static_cast<int64_t>(16384 * 0.96));
    EXPECT_LE(batch[r][0], static_cast<int64_t>(16384 * 1.04) + 392);
  }
}

TEST(DataStreamTest, IsSeededAndEachStepStandsAlone) {
  auto codes = *ParseDataCodes(ScenarioCodes("joint"));
  auto a = DataStream::Create(codes, 64, 1);
  auto b = DataStream::Create(codes, 64, 1);
  auto c = DataStream::Create(codes, 64, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const RankLengths step3 = a->Batch(3);
  (void)b->Batch(0);
  EXPECT_EQ(b->Batch(3), step3);  // no hidden state between steps
  EXPECT_NE(a->Batch(4), step3);
  EXPECT_NE(c->Batch(3), step3);
}

TEST(DataStreamTest, TextTokensAreUniformOnZeroTo392) {
  // 16x16 pixels = one visual token (0 or 1 after the aspect factor), so the
  // length is almost all text.
  auto stream = DataStream::Create(*ParseDataCodes("g1b1000i16f1s0"), 8, 3);
  ASSERT_TRUE(stream.ok());
  double sum = 0;
  int64_t count = 0, low = 1 << 30, high = 0;
  for (int step = 0; step < 10; ++step) {
    for (const auto& rank : stream->Batch(step)) {
      for (int64_t l : rank) {
        sum += l;
        ++count;
        low = std::min(low, l);
        high = std::max(high, l);
      }
    }
  }
  EXPECT_EQ(count, 80000);
  EXPECT_LE(low, 1);
  EXPECT_GE(high, 392);
  EXPECT_LE(high, 393);
  EXPECT_NEAR(sum / count, 196.5, 2.0);  // mean 196 + about half a visual token
}

TEST(DataStreamTest, RejectsWorldsThatDoNotFitTheBlock) {
  auto stream = DataStream::Create(*ParseDataCodes(ScenarioCodes("mixed-res")), 48, 0);
  ASSERT_FALSE(stream.ok());
  EXPECT_THAT(std::string(stream.status().message()),
              HasSubstr("48 must be a positive multiple of the data codes' 32 GPUs"));
}

}  // namespace
}  // namespace knapformer
