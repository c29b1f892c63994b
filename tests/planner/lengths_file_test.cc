// A user's lengths file: what is read, the error for each malformed line
// (its line and field), and the batches a distributed loader would make
// from it: every sample dealt once per epoch, each rank's shard batched by
// count or by a token budget, the same batches whichever order steps are
// asked in.
#include "planner/lengths_file.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(LengthsFileTest, ReadsTokensMasksCommentsAndAHeader) {
  absl::StatusOr<LengthsFile> file = ParseLengthsFile(
      "tokens,mask\n# a comment\n\n4096\r\n 1300 , causal\n8,spans=3:c;5:f\n12,window=4\n",
      "data.txt");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->samples.size(), 4u);
  EXPECT_EQ(file->masked, 3);
  EXPECT_EQ(file->samples[0].tokens, 4096);
  EXPECT_FALSE(file->samples[0].mask.has_value());
  EXPECT_EQ(file->samples[1].tokens, 1300);
  EXPECT_EQ(*file->samples[1].mask, AttentionMask::Causal());
  EXPECT_EQ(*file->samples[2].mask, AttentionMask::Spans({{3, true}, {5, false}}));
  EXPECT_EQ(*file->samples[3].mask, AttentionMask::Window(4));
}

TEST(LengthsFileTest, EachMalformedLineIsNamedWithItsField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"10\nabc\n", "f.txt:2: tokens: 'abc' is not a whole number"},
      {"10\n\n0\n", "f.txt:3: tokens: 0 is outside [1, 2147483647]"},
      {"-5\n", "f.txt:1: tokens: -5 is outside"},
      {"2147483648\n", "f.txt:1: tokens: 2147483648 is outside"},
      {"10,sideways\n", "f.txt:1: mask"},
      {"10,spans=3:c;5:f\n", "f.txt:1: mask"},  // the spans add up to 8, not 10
      {"10,window=0\n", "f.txt:1: mask: 'window=0'"},
      {"# nothing\n\n", "f.txt: no samples"},
      {"", "f.txt: no samples"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<LengthsFile> file = ParseLengthsFile(text, "f.txt");
    ASSERT_FALSE(file.ok()) << text;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(message)) << text;
  }
}

LengthsFile Numbered(int n) {  // sample i has i + 1 tokens: its identity
  std::string text;
  for (int i = 0; i < n; ++i) absl::StrAppend(&text, i + 1, "\n");
  return *ParseLengthsFile(text, "numbered");
}

TEST(LengthsFileTest, StreamArgumentsAreChecked) {
  EXPECT_THAT(std::string(LengthsStream::Create(Numbered(4), 0, {1, 0}, 0, true)
                              .status()
                              .message()),
              HasSubstr("world: 0 is outside"));
  for (LoaderBatching bad : {LoaderBatching{0, 0}, LoaderBatching{2, 100},
                             LoaderBatching{-1, 0}}) {
    EXPECT_THAT(std::string(LengthsStream::Create(Numbered(4), 2, bad, 0, true)
                                .status()
                                .message()),
                HasSubstr("exactly one must be > 0"));
  }
}

// In file order, samples per GPU: rank r's shard is r, r + W, ... and each
// epoch deals every sample once (with wrap-around padding: 10 samples on 4
// ranks pad to 12 with the first two).
TEST(LengthsFileTest, SamplesPerGpuDealsShardsAsADistributedSampler) {
  auto stream = LengthsStream::Create(Numbered(10), 4, {3, 0}, 0, /*shuffle=*/false);
  ASSERT_TRUE(stream.ok()) << stream.status();
  LengthsStream::Step step0 = stream->Batch(0);
  EXPECT_TRUE(step0.masks.empty());
  EXPECT_EQ(step0.lengths, (RankLengths{{1, 5, 9}, {2, 6, 10}, {3, 7, 1}, {4, 8, 2}}));
  // Step 1 starts the second epoch (a shard is 3 samples long).
  EXPECT_EQ(stream->Batch(1).lengths, step0.lengths);
}

TEST(LengthsFileTest, ShuffledEpochsDealEverySampleOnceAndDiffer) {
  const int n = 64;
  auto stream = LengthsStream::Create(Numbered(n), 8, {2, 0}, 7, /*shuffle=*/true);
  ASSERT_TRUE(stream.ok());
  std::vector<std::vector<int64_t>> epochs(2);
  for (int64_t step = 0; step < 8; ++step) {  // 8 steps x 8 ranks x 2 = two epochs
    const RankLengths lengths = stream->Batch(step).lengths;
    for (const auto& rank : lengths) {
      for (int64_t tokens : rank) epochs[step / 4].push_back(tokens);
    }
  }
  for (auto& epoch : epochs) {
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i + 1);
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a new permutation each epoch
  // The same seed gives the same batches, asked in any order.
  auto again = LengthsStream::Create(Numbered(n), 8, {2, 0}, 7, true);
  EXPECT_EQ(again->Batch(5).lengths, stream->Batch(5).lengths);
  EXPECT_EQ(again->Batch(0).lengths, stream->Batch(0).lengths);
  auto other_seed = LengthsStream::Create(Numbered(n), 8, {2, 0}, 8, true);
  EXPECT_NE(other_seed->Batch(0).lengths, stream->Batch(0).lengths);
}

// A token budget: each rank takes its shard's samples in order while they
// fit; a sample over the budget goes alone. Steps asked out of order replay.
TEST(LengthsFileTest, TokenBudgetBatchesEachShardInOrder) {
  auto file = ParseLengthsFile("6\n1\n3\n9\n2\n2\n20\n1\n4\n4\n", "budget");
  ASSERT_TRUE(file.ok());
  // Two ranks in file order: rank 0's shard is 6 3 2 20 4, rank 1's 1 9 2 1 4.
  auto stream = LengthsStream::Create(*file, 2, {0, 10}, 0, false);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(stream->samples_over_budget(), 1);
  const RankLengths step0 = stream->Batch(0).lengths;
  EXPECT_EQ(step0, (RankLengths{{6, 3}, {1, 9}}));
  const RankLengths step1 = stream->Batch(1).lengths;
  EXPECT_EQ(step1, (RankLengths{{2}, {2, 1, 4, 1}}));  // rank 1 wraps into epoch 2
  EXPECT_EQ(stream->Batch(2).lengths, (RankLengths{{20}, {9}}));  // 20 alone
  EXPECT_EQ(stream->Batch(1).lengths, step1);  // replayed
  for (const auto& rank : step1) {
    int64_t tokens = 0;
    for (int64_t t : rank) tokens += t;
    EXPECT_LE(tokens, 10);
  }
}

TEST(LengthsFileTest, MasksFollowTheirSamplesAndMissingOnesAreFull) {
  auto file = ParseLengthsFile("4,causal\n5\n6,window=2\n7\n", "masked");
  ASSERT_TRUE(file.ok());
  auto stream = LengthsStream::Create(*file, 2, {2, 0}, 3, true);
  ASSERT_TRUE(stream.ok());
  const std::map<int64_t, AttentionMask> expected = {{4, AttentionMask::Causal()},
                                                     {5, AttentionMask::Full()},
                                                     {6, AttentionMask::Window(2)},
                                                     {7, AttentionMask::Full()}};
  LengthsStream::Step step = stream->Batch(0);
  ASSERT_EQ(step.masks.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(step.masks[r].size(), step.lengths[r].size());
    for (size_t i = 0; i < step.lengths[r].size(); ++i) {
      EXPECT_EQ(step.masks[r][i], expected.at(step.lengths[r][i]));
    }
  }
}

}  // namespace
}  // namespace knapformer
