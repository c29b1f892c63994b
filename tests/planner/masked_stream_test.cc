// The masked data streams: reproducible per (seed, step, rank), valid masks
// that differ between sequences, and the structure and numbers
// planner/masked_stream.h documents.
#include "planner/masked_stream.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/attention_mask.h"
#include "planner/cost_model.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace masked_data;  // NOLINT: the documented constants under test

MaskedStream::Step BatchOf(const std::string& name, int64_t world, uint64_t seed, int64_t step) {
  auto stream = MaskedStream::Create(name, world, seed);
  EXPECT_TRUE(stream.ok()) << stream.status();
  return stream.ok() ? stream->Batch(step) : MaskedStream::Step();
}

TEST(MaskedStreamTest, NamesAndErrors) {
  EXPECT_THAT(MaskedScenarioNames(), ElementsAre("video-blockcausal", "interleaved", "llm-packed"));
  for (const std::string& name : MaskedScenarioNames()) {
    EXPECT_TRUE(IsMaskedScenario(name));
    EXPECT_NE(MaskedScenarioSummary(name), "");
  }
  EXPECT_FALSE(IsMaskedScenario("mixed-res"));
  EXPECT_EQ(MaskedScenarioSummary("mixed-res"), "");
  auto unknown = MaskedStream::Create("video", 8, 0);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown masked stream 'video' (video-blockcausal, interleaved, "
                        "llm-packed)"));
  EXPECT_THAT(std::string(MaskedStream::Create("llm-packed", 0, 0).status().message()),
              HasSubstr("world: must be in [1, 1048576], got 0"));
  EXPECT_FALSE(MaskedStream::Create("llm-packed", (1 << 20) + 1, 0).ok());
}

TEST(MaskedStreamTest, StepOfRankDependsOnlyOnSeedStepAndRank) {
  for (const std::string& name : MaskedScenarioNames()) {
    SCOPED_TRACE(name);
    const MaskedStream::Step small = BatchOf(name, 8, 7, 3);
    const MaskedStream::Step large = BatchOf(name, 32, 7, 3);
    ASSERT_EQ(small.lengths.size(), 8u);
    ASSERT_EQ(large.lengths.size(), 32u);
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(small.lengths[r], large.lengths[r]) << r;
      EXPECT_EQ(small.masks[r], large.masks[r]) << r;
    }
    const MaskedStream::Step again = BatchOf(name, 32, 7, 3);
    EXPECT_EQ(again.lengths, large.lengths);
    EXPECT_EQ(again.masks, large.masks);
    EXPECT_NE(BatchOf(name, 32, 8, 3).masks, large.masks);  // another seed
    EXPECT_NE(BatchOf(name, 32, 7, 4).masks, large.masks);  // another step
    EXPECT_NE(large.masks[0], large.masks[1]);              // another rank
  }
  // The streams of one seed differ from each other.
  EXPECT_NE(BatchOf("video-blockcausal", 4, 0, 0).lengths, BatchOf("interleaved", 4, 0, 0).lengths);
}

// Every mask valid; and masks differ where it matters: the share of the
// full-attention cost a sequence really pays (what a mask-blind plan gets
// wrong) varies between sequences.
TEST(MaskedStreamTest, MasksAreValidAndDiffer) {
  const CostModel cost = *CostModel::Create(3072, 0.49);
  for (const std::string& name : MaskedScenarioNames()) {
    SCOPED_TRACE(name);
    for (int64_t step = 0; step < 3; ++step) {
      const MaskedStream::Step batch = BatchOf(name, 64, 1, step);
      ASSERT_TRUE(CheckRankMasks(batch.lengths, batch.masks).ok())
          << CheckRankMasks(batch.lengths, batch.masks);
      std::set<std::string> distinct;
      size_t sequences = 0;
      double lowest = 1, highest = 0;
      for (size_t r = 0; r < batch.lengths.size(); ++r) {
        EXPECT_FALSE(batch.lengths[r].empty()) << "rank " << r;
        for (size_t i = 0; i < batch.lengths[r].size(); ++i) {
          const int64_t length = batch.lengths[r][i];
          EXPECT_GE(length, 1);
          distinct.insert(MaskText(batch.masks[r][i]));
          ++sequences;
          const double share = cost.Workload(length, &batch.masks[r][i]) / cost.Workload(length);
          lowest = std::min(lowest, share);
          highest = std::max(highest, share);
        }
      }
      // Packed documents share two masks (causal, window) by design; the
      // span masks of video and interleaved samples are nearly all distinct.
      if (name == "llm-packed") {
        EXPECT_EQ(distinct.size(), 2u);
      } else {
        EXPECT_GT(distinct.size(), sequences * 9 / 10) << sequences;
      }
      // d = 3072: attention is a small part of short sequences (most
      // interleaved samples), so even there the spread stays under 20%.
      EXPECT_LT(lowest, 0.9);
      EXPECT_GT(highest, 0.95);
    }
  }
}

int64_t FrameTokensOf(int64_t resolution) { return (resolution / 16) * (resolution / 16); }

TEST(MaskedStreamTest, VideoClipsAreACausalCaptionThenFullChunksOfSixFrames) {
  std::set<int64_t> resolutions_seen;
  for (int64_t step = 0; step < 4; ++step) {
    const MaskedStream::Step batch = BatchOf("video-blockcausal", 64, 2, step);
    for (size_t r = 0; r < batch.masks.size(); ++r) {
      const auto& clips = batch.masks[r];
      ASSERT_GE(clips.size(), 1u);
      ASSERT_LE(clips.size(), static_cast<size_t>(kVideoMaxClips));
      // One resolution per rank: the first chunk of the first clip, always
      // whole (a clip has at least 16 frames), tells it.
      const int64_t frame_tokens = clips[0].spans.at(1).length / kVideoChunkFrames;
      int64_t resolution = 0;
      for (int64_t candidate : kVideoResolutions) {
        if (FrameTokensOf(candidate) == frame_tokens) resolution = candidate;
      }
      ASSERT_NE(resolution, 0) << "rank " << r << ": " << MaskText(clips[0]);
      resolutions_seen.insert(resolution);
      const int64_t most_frames = std::min(kVideoMaxFrames, kVideoMaxClipTokens / frame_tokens);
      for (size_t c = 0; c < clips.size(); ++c) {
        const AttentionMask& mask = clips[c];
        SCOPED_TRACE(MaskText(mask));
        ASSERT_EQ(mask.kind, AttentionMask::Kind::kSpans);
        ASSERT_GE(mask.spans.size(), 4u);  // >= 16 frames: 3 chunks
        EXPECT_TRUE(mask.spans[0].causal);
        EXPECT_GE(mask.spans[0].length, kCaptionMin);
        EXPECT_LE(mask.spans[0].length, kCaptionMax);
        int64_t frames = 0;
        for (size_t j = 1; j < mask.spans.size(); ++j) {
          EXPECT_FALSE(mask.spans[j].causal);
          ASSERT_EQ(mask.spans[j].length % frame_tokens, 0);
          const int64_t chunk = mask.spans[j].length / frame_tokens;
          if (j + 1 < mask.spans.size()) {
            EXPECT_EQ(chunk, kVideoChunkFrames);
          }
          EXPECT_GE(chunk, 1);
          EXPECT_LE(chunk, kVideoChunkFrames);
          frames += chunk;
        }
        EXPECT_GE(frames, kVideoMinFrames);
        EXPECT_LE(frames, most_frames);
        EXPECT_LE(batch.lengths[r][c] - mask.spans[0].length, kVideoMaxClipTokens);
      }
    }
  }
  EXPECT_EQ(resolutions_seen.size(), std::size(kVideoResolutions));
}

TEST(MaskedStreamTest, InterleavedSamplesAlternateCausalTextAndFullImages) {
  int64_t images[3] = {0, 0, 0};
  for (int64_t step = 0; step < 4; ++step) {
    const MaskedStream::Step batch = BatchOf("interleaved", 64, 3, step);
    for (size_t r = 0; r < batch.masks.size(); ++r) {
      EXPECT_GE(batch.masks[r].size(), static_cast<size_t>(kInterleavedMinSamples));
      EXPECT_LE(batch.masks[r].size(), static_cast<size_t>(kInterleavedMaxSamples));
      for (const AttentionMask& mask : batch.masks[r]) {
        SCOPED_TRACE(MaskText(mask));
        ASSERT_EQ(mask.kind, AttentionMask::Kind::kSpans);
        // text (image text)^k, 1 <= k <= 16
        ASSERT_EQ(mask.spans.size() % 2, 1u);
        ASSERT_GE(mask.spans.size(), 3u);
        ASSERT_LE(mask.spans.size(), static_cast<size_t>(2 * kInterleavedMaxImages + 1));
        for (size_t j = 0; j < mask.spans.size(); ++j) {
          const MaskSpan& span = mask.spans[j];
          if (j % 2 == 0) {
            EXPECT_TRUE(span.causal);
            EXPECT_GE(span.length, kTextMin);
            EXPECT_LE(span.length, kTextMax);
            continue;
          }
          EXPECT_FALSE(span.causal);
          const int64_t* kind = std::find(std::begin(kImageTokens), std::end(kImageTokens),
                                          span.length);
          ASSERT_NE(kind, std::end(kImageTokens)) << span.length;
          ++images[kind - std::begin(kImageTokens)];
        }
      }
    }
  }
  // 40% / 40% / 20%, within a few points over thousands of images.
  const double total = images[0] + images[1] + images[2];
  EXPECT_NEAR(images[0] / total, 0.4, 0.04);
  EXPECT_NEAR(images[1] / total, 0.4, 0.04);
  EXPECT_NEAR(images[2] / total, 0.2, 0.04);
}

TEST(MaskedStreamTest, PackedDocumentsFillTheBudgetCausalOrInAWindow) {
  std::vector<int64_t> whole;  // every document but each rank's last (cut to fit)
  int64_t windowed = 0, documents = 0, longest = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const MaskedStream::Step batch = BatchOf("llm-packed", 64, 4, step);
    for (size_t r = 0; r < batch.lengths.size(); ++r) {
      int64_t sum = 0;
      for (size_t i = 0; i < batch.lengths[r].size(); ++i) {
        const int64_t length = batch.lengths[r][i];
        const AttentionMask& mask = batch.masks[r][i];
        sum += length;
        longest = std::max(longest, length);
        ++documents;
        if (mask.kind == AttentionMask::Kind::kWindow) {
          EXPECT_EQ(mask.window, kLlmWindow);
          ++windowed;
        } else {
          EXPECT_EQ(mask.kind, AttentionMask::Kind::kCausal);
        }
        if (i + 1 < batch.lengths[r].size()) {
          EXPECT_GE(length, kLlmMinDocument);
          whole.push_back(length);
        }
      }
      EXPECT_EQ(sum, kLlmRankTokens) << "rank " << r;
    }
  }
  EXPECT_NEAR(static_cast<double>(windowed) / documents, 0.25, 0.05);
  // Lognormal, median 2048: within the sampling error of ~1000 documents
  // (and the pull of long documents, which the cut favours, on the rest).
  std::sort(whole.begin(), whole.end());
  EXPECT_GT(whole[whole.size() / 2], 1500);
  EXPECT_LT(whole[whole.size() / 2], 2800);
  EXPECT_GT(longest, 65536);  // the long tail reaches past 64k
}

}  // namespace
}  // namespace knapformer
