#include "planner/masked_stream.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/splitmix64.h"

namespace knapformer {
namespace {

using namespace masked_data;  // NOLINT: the constants this file implements

constexpr int64_t kMaxWorld = int64_t{1} << 20;
constexpr double kTwoPi = 6.283185307179586;

struct Named {
  const char* name;
  MaskedStream::Kind kind;
  const char* summary;
};

constexpr Named kStreams[] = {
    {"video-blockcausal", MaskedStream::Kind::kVideoBlockCausal,
     "block-causal video clips, 1-4 per rank at 256-1024 px, 16-128 latent frames, "
     "a causal caption then full chunks of 6 frames"},
    {"interleaved", MaskedStream::Kind::kInterleaved,
     "interleaved text and images, 4-16 samples per rank, causal text spans, full image "
     "spans of 256/1024/4096 tokens"},
    {"llm-packed", MaskedStream::Kind::kLlmPacked,
     "LLM documents packed to 131072 tokens per rank, lognormal lengths (median 2048), "
     "causal, 1 in 4 in a 4096-token sliding window"},
};

const Named* Find(absl::string_view name) {
  for (const Named& stream : kStreams) {
    if (name == stream.name) return &stream;
  }
  return nullptr;
}

// U{lo..hi}. REQUIRES: lo <= hi.
int64_t Between(SplitMix64& random, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(random.Below(static_cast<uint64_t>(hi - lo + 1)));
}

// exp(N(log median, sigma^2)) rounded, clipped to [lo, hi]: document and text
// lengths are long-tailed. Box-Muller on two uniforms; 1 - U keeps log's
// argument in (0, 1].
int64_t LogNormal(SplitMix64& random, double median, double sigma, int64_t lo, int64_t hi) {
  const double u = 1.0 - random.Uniform();
  const double v = random.Uniform();
  const double normal = std::sqrt(-2.0 * std::log(u)) * std::cos(kTwoPi * v);
  const double value = std::round(median * std::exp(sigma * normal));
  if (!(value >= static_cast<double>(lo))) return lo;  // also a NaN, which cannot happen
  return value >= static_cast<double>(hi) ? hi : static_cast<int64_t>(value);
}

// One rank's sequences of one step.
struct RankBatch {
  std::vector<int64_t> lengths;
  std::vector<AttentionMask> masks;

  void Add(int64_t length, AttentionMask mask) {
    lengths.push_back(length);
    masks.push_back(std::move(mask));
  }
  void Add(std::vector<MaskSpan> spans) {
    int64_t length = 0;
    for (const MaskSpan& span : spans) length += span.length;
    Add(length, AttentionMask::Spans(std::move(spans)));
  }
};

// A causal caption, then the clip's latent frames in chunks of
// kVideoChunkFrames, each a full span.
void AddClip(SplitMix64& random, int64_t frame_tokens, RankBatch& out) {
  const int64_t most = std::min(kVideoMaxFrames, kVideoMaxClipTokens / frame_tokens);
  const int64_t frames = Between(random, kVideoMinFrames, most);
  std::vector<MaskSpan> spans = {{Between(random, kCaptionMin, kCaptionMax), true}};
  for (int64_t first = 0; first < frames; first += kVideoChunkFrames) {
    spans.push_back({std::min(kVideoChunkFrames, frames - first) * frame_tokens, false});
  }
  out.Add(std::move(spans));
}

void VideoRank(SplitMix64& random, RankBatch& out) {
  const int64_t resolution = kVideoResolutions[random.Below(std::size(kVideoResolutions))];
  const int64_t frame_tokens = (resolution / 16) * (resolution / 16);
  const int64_t clips = Between(random, 1, kVideoMaxClips);
  for (int64_t c = 0; c < clips; ++c) AddClip(random, frame_tokens, out);
}

int64_t ImageTokens(SplitMix64& random) {
  const uint64_t draw = random.Below(5);  // 2/5, 2/5, 1/5
  return kImageTokens[draw < 2 ? 0 : draw < 4 ? 1 : 2];
}

MaskSpan Text(SplitMix64& random) {
  return {LogNormal(random, kTextMedian, kTextSigma, kTextMin, kTextMax), true};
}

// Text, then k images each followed by text: k = 1 + Geometric(1/2).
void AddInterleavedSample(SplitMix64& random, RankBatch& out) {
  int64_t images = 1;
  while (images < kInterleavedMaxImages && random.Below(2) == 0) ++images;
  std::vector<MaskSpan> spans = {Text(random)};
  for (int64_t i = 0; i < images; ++i) {
    spans.push_back({ImageTokens(random), false});
    spans.push_back(Text(random));
  }
  out.Add(std::move(spans));
}

void InterleavedRank(SplitMix64& random, RankBatch& out) {
  const int64_t samples = Between(random, kInterleavedMinSamples, kInterleavedMaxSamples);
  for (int64_t s = 0; s < samples; ++s) AddInterleavedSample(random, out);
}

// Documents until the budget is full; the last is cut to fit.
void LlmRank(SplitMix64& random, RankBatch& out) {
  for (int64_t left = kLlmRankTokens; left > 0;) {
    const int64_t length =
        std::min(left, LogNormal(random, kLlmMedian, kLlmSigma, kLlmMinDocument, kLlmRankTokens));
    const bool windowed = random.Below(kLlmOneInWindowed) == 0;
    out.Add(length, windowed ? AttentionMask::Window(kLlmWindow) : AttentionMask::Causal());
    left -= length;
  }
}

// An independent generator per (seed, step, rank), as DataStream's, with the
// stream's kind mixed in so that the three streams of one seed differ.
SplitMix64 RankRandom(uint64_t seed, MaskedStream::Kind kind, int64_t step, int64_t rank) {
  const uint64_t step_key =
      SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(step)).Next()).Next();
  const uint64_t rank_key =
      SplitMix64(static_cast<uint64_t>(rank) * 4 + static_cast<uint64_t>(kind) +
                 0x3C6EF372FE94F82Bull)
          .Next();
  return SplitMix64(step_key ^ rank_key);
}

}  // namespace

std::vector<std::string> MaskedScenarioNames() {
  std::vector<std::string> names;
  for (const Named& stream : kStreams) names.push_back(stream.name);
  return names;
}

bool IsMaskedScenario(absl::string_view name) { return Find(name) != nullptr; }

std::string MaskedScenarioSummary(absl::string_view name) {
  const Named* stream = Find(name);
  return stream == nullptr ? "" : stream->summary;
}

absl::StatusOr<MaskedStream> MaskedStream::Create(absl::string_view name, int64_t world_size,
                                                  uint64_t seed) {
  const Named* stream = Find(name);
  if (stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data: unknown masked stream '", name, "' (", absl::StrJoin(MaskedScenarioNames(), ", "),
        ")"));
  }
  if (world_size < 1 || world_size > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("world: must be in [1, ", kMaxWorld, "], got ", world_size));
  }
  return MaskedStream(stream->kind, world_size, seed);
}

MaskedStream::Step MaskedStream::Batch(int64_t step) const {
  Step out;
  out.lengths.resize(world_size_);
  out.masks.resize(world_size_);
  for (int64_t rank = 0; rank < world_size_; ++rank) {
    SplitMix64 random = RankRandom(seed_, kind_, step, rank);
    RankBatch batch;
    switch (kind_) {
      case Kind::kVideoBlockCausal:
        VideoRank(random, batch);
        break;
      case Kind::kInterleaved:
        InterleavedRank(random, batch);
        break;
      case Kind::kLlmPacked:
        LlmRank(random, batch);
        break;
    }
    out.lengths[rank] = std::move(batch.lengths);
    out.masks[rank] = std::move(batch.masks);
  }
  return out;
}

}  // namespace knapformer
