#include "planner/attention_mask.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/cost_model.h"
#include "planner/mask_json.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

// Whether query q attends to key k under `mask`, straight from the
// definitions (not from AttendedPairs' closed forms).
bool Attends(const AttentionMask& mask, int64_t q, int64_t k) {
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return true;
    case AttentionMask::Kind::kCausal:
      return k <= q;
    case AttentionMask::Kind::kWindow:
      return k <= q && q - k < mask.window;
    case AttentionMask::Kind::kSpans: {
      int64_t start = 0;
      for (const MaskSpan& span : mask.spans) {
        const int64_t end = start + span.length;
        if (q >= start && q < end) {
          if (k < start) return true;                 // every earlier span
          if (k >= end) return false;                 // no later one
          return !span.causal || k <= q;              // itself
        }
        start = end;
      }
      return false;
    }
  }
  return false;
}

double CountPairs(int64_t length, const AttentionMask& mask) {
  double pairs = 0;
  for (int64_t q = 0; q < length; ++q) {
    for (int64_t k = 0; k < length; ++k) pairs += Attends(mask, q, k) ? 1 : 0;
  }
  return pairs;
}

TEST(AttentionMaskTest, ClosedFormsCountThePairsTheMaskAttends) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t length = 1 + static_cast<int64_t>(random() % 70);
    std::vector<AttentionMask> masks = {AttentionMask::Full(), AttentionMask::Causal(),
                                        AttentionMask::Window(1 + random() % 90)};
    std::vector<MaskSpan> spans;
    for (int64_t left = length; left > 0;) {
      const int64_t n = std::min<int64_t>(left, 1 + random() % 20);
      spans.push_back({n, random() % 2 == 0});
      left -= n;
    }
    masks.push_back(AttentionMask::Spans(spans));
    for (const AttentionMask& mask : masks) {
      ASSERT_TRUE(CheckMask(length, mask, "m").ok()) << MaskText(mask);
      EXPECT_EQ(AttendedPairs(length, mask), CountPairs(length, mask))
          << "length " << length << " mask " << MaskText(mask);
    }
  }
}

TEST(AttentionMaskTest, TheIssuesFormulasAtScale) {
  const int64_t l = int64_t{1} << 20;
  EXPECT_EQ(AttendedPairs(l, AttentionMask::Full()), 1099511627776.0);
  EXPECT_EQ(AttendedPairs(l, AttentionMask::Causal()), 549756338176.0);
  // window w < l: w(w+1)/2 + (l-w)w
  EXPECT_EQ(AttendedPairs(l, AttentionMask::Window(4096)),
            4096.0 * 4097 / 2 + (1048576.0 - 4096) * 4096);
  // 64 full chunks of 16384: block-causal is (64*65/2) * 16384^2, about half.
  std::vector<MaskSpan> chunks(64, MaskSpan{16384, false});
  EXPECT_EQ(AttendedPairs(l, AttentionMask::Spans(chunks)), 2080.0 * 16384 * 16384);
}

TEST(AttentionMaskTest, CostModelUsesThePairsAndIsUnchangedWithoutAMask) {
  auto cost = CostModel::Create(3072, 0.49);
  ASSERT_TRUE(cost.ok());
  const AttentionMask full = AttentionMask::Full();
  for (int64_t l : {0, 1, 7, 4096, 1 << 20}) {
    EXPECT_EQ(cost->Workload(l, nullptr), cost->Workload(l));
    EXPECT_EQ(cost->Workload(l, &full), cost->Workload(l));
  }
  const AttentionMask causal = AttentionMask::Causal();
  EXPECT_DOUBLE_EQ(cost->Attention(1000, &causal), 0.49 * 4 * 3072 * 500500.0);
  EXPECT_DOUBLE_EQ(cost->Workload(1000, &causal), 24.0 * 1000 * 3072 * 3072 + 0.49 * 4 * 3072 * 500500.0);
  // The uniform model prices every non-empty sequence alike, mask or not.
  auto uniform = CostModel::Create(3072, 0.49, CostKind::kUniform);
  EXPECT_EQ(uniform->Workload(1000, &causal), 1.0);
}

TEST(AttentionMaskTest, MalformedMasksNameTheFieldAndTheLimit) {
  EXPECT_THAT(std::string(CheckMask(10, AttentionMask::Window(0), "masks[1][2]").message()),
              HasSubstr("masks[1][2].window: must be at least 1, got 0"));
  EXPECT_THAT(std::string(CheckMask(10, AttentionMask::Spans({{4, false}, {5, true}}), "m")
                              .message()),
              HasSubstr("m.spans: lengths add up to 9, the sequence has 10 tokens"));
  EXPECT_THAT(std::string(CheckMask(10, AttentionMask::Spans({{0, false}, {10, true}}), "m")
                              .message()),
              HasSubstr("m.spans[0]: length must be in [1, 10]"));
  EXPECT_THAT(std::string(CheckMask(10, AttentionMask::Spans({}), "m").message()),
              HasSubstr("m.spans: must not be empty"));
  std::vector<MaskSpan> many(AttentionMask::kMaxSpans + 1, MaskSpan{1, false});
  EXPECT_THAT(std::string(CheckMask(static_cast<int64_t>(many.size()),
                                    AttentionMask::Spans(many), "m")
                              .message()),
              HasSubstr("m.spans: 4097 spans exceed the limit of 4096"));
  EXPECT_TRUE(CheckMask(0, AttentionMask::Causal(), "m").ok());
  EXPECT_TRUE(CheckMask(3, AttentionMask::Window(100), "m").ok());
}

TEST(AttentionMaskTest, MasksOnSomeRanksOnlyAreRefusedNamingTheRank) {
  const std::vector<std::vector<int64_t>> lengths = {{5, 6}, {}, {7}};
  EXPECT_TRUE(CheckRankMasks(lengths, {}).ok());
  RankMasks some = {{AttentionMask::Causal(), AttentionMask::Full()}, {}, {}};
  absl::Status status = CheckRankMasks(lengths, some);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("masks[2]: 0 masks for 1 sequences"));
  RankMasks few = {{AttentionMask::Causal()}};
  EXPECT_THAT(std::string(CheckRankMasks(lengths, few).message()),
              HasSubstr("masks: got masks for 1 ranks, there are 3"));
  RankMasks bad = {{AttentionMask::Causal(), AttentionMask::Spans({{5, true}})}, {},
                   {AttentionMask::Window(2)}};
  EXPECT_THAT(std::string(CheckRankMasks(lengths, bad).message()),
              HasSubstr("masks[0][1].spans: lengths add up to 5, the sequence has 6 tokens"));
}

TEST(MaskJsonTest, ParsesEveryFormAndWritesItBack) {
  auto masks = ParseRankMasksJson(
      R"([["full", "causal"], [{"window": 64}], [{"spans": [[3, "causal"], [5, "full"]]}], []])");
  ASSERT_TRUE(masks.ok()) << masks.status();
  ASSERT_EQ(masks->size(), 4u);
  EXPECT_EQ((*masks)[0][0], AttentionMask::Full());
  EXPECT_EQ((*masks)[0][1], AttentionMask::Causal());
  EXPECT_EQ((*masks)[1][0], AttentionMask::Window(64));
  EXPECT_EQ((*masks)[2][0], AttentionMask::Spans({{3, true}, {5, false}}));
  for (const auto& rank : *masks) {
    for (const AttentionMask& mask : rank) {
      auto again = ParseMaskJson(MaskToJson(mask), "m");
      ASSERT_TRUE(again.ok()) << MaskToJson(mask);
      EXPECT_EQ(*again, mask);
    }
  }
}

TEST(MaskJsonTest, MalformedFormsNameTheField) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"([["diagonal"]])", "masks[0][0]: unknown mask kind 'diagonal'"},
      {R"([[{"window": 0}]])", "masks[0][0].window: must be at least 1, got 0"},
      {R"([[{"window": -3}]])", "masks[0][0].window: must be at least 1, got -3"},
      {R"([[{"window": 2.5}]])", "masks[0][0].window: must be an integer"},
      {R"([[], [{"spans": [[2, "sideways"]]}]])",
       "masks[1][0].spans[0]: unknown span kind \"sideways\""},
      {R"([[{"spans": []}]])", "masks[0][0].spans: must not be empty"},
      {R"([[{"spans": [[0, "full"]]}]])", "masks[0][0].spans[0]: length must be at least 1"},
      {R"([[{"spans": [3]}]])", "masks[0][0].spans[0]: must be a pair"},
      {R"([[{"blocks": 3}]])", "masks[0][0]: unknown mask kind 'blocks'"},
      {R"([[{"window": 3, "spans": []}]])", "masks[0][0]: must be one of"},
      {R"([["full"], 7])", "masks[1]: must be an array of masks"},
      {R"({"0": []})", "masks: must be an array of arrays of masks"},
      {R"([[)", "masks: not valid JSON"},
  };
  for (const Case& c : cases) {
    auto masks = ParseRankMasksJson(c.json);
    ASSERT_FALSE(masks.ok()) << c.json;
    EXPECT_EQ(masks.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(masks.status().message()), HasSubstr(c.message)) << c.json;
  }
  std::string many = R"([[{"spans": [)";
  for (int j = 0; j <= AttentionMask::kMaxSpans; ++j) many += j > 0 ? R"(,[1,"full"])" : R"([1,"full"])";
  many += "]}]]";
  EXPECT_THAT(std::string(ParseRankMasksJson(many).status().message()),
              HasSubstr("masks[0][0].spans: 4097 spans exceed the limit of 4096"));
}

}  // namespace
}  // namespace knapformer
