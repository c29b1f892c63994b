#ifndef KNAPFORMER_PLANNER_MASKED_STREAM_H_
#define KNAPFORMER_PLANNER_MASKED_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"

namespace knapformer {

// Seeded synthetic data whose sequences carry attention masks
// (attention_mask.h) that differ from sequence to sequence: where every
// sequence had the same mask, a plan that ignores masks would be as good as
// one that uses them. Three streams, by name:
//
// "video-blockcausal": block-causal video generation (MAGI-1, CausVid). Each
//   rank's micro-batch has one resolution (a bucketed loader), drawn
//   uniformly from 256, 512, 768, 1024 px: (R/16)^2 = 256, 1024, 2304, 4096
//   tokens per latent frame (8x VAE, 2x2 patches, as the paper's data
//   codes), and 1..4 clips (uniform), so raw loads differ a lot between
//   ranks. A clip has U{16..F} latent frames (4x temporal compression), F =
//   min(128, 131072 / tokens per frame), so no clip's frames pass 128k
//   tokens (1024 px: at most 32 frames). Its mask: a causal caption prefix of
//   U{32..256} tokens, then one full span per chunk of 6 latent frames (24
//   video frames, MAGI-1's chunk; the last chunk may be shorter), each chunk
//   attending to itself and everything before it.
// "interleaved": Transfusion-style interleaved text and images, one sample
//   per sequence, 4..16 samples per rank (uniform). A sample is text, then
//   k images each followed by text, k = 1 + Geometric(1/2) capped at 16
//   (mean 2). Text spans are causal, lognormal with median 192 tokens and
//   sigma 1.5, clipped to [4, 16384]; image spans are full, 256 (40%),
//   1024 (40%) or 4096 (20%) tokens (256, 512 and 1024 px).
// "llm-packed": LLM pretraining with documents packed into a fixed budget
//   of 131072 tokens per rank (a 128k long-context stage), each document its
//   own sequence (varlen attention, no cross-document attention). Document
//   lengths are lognormal, median 2048, sigma 1.75 (mean ~9.5k; 5.7% over
//   32k, 0.9% at the 128k cap), at least 32 tokens; the last one is cut to
//   fill the budget, so every rank holds exactly 131072 tokens and only
//   attention makes loads differ. Each document is causal, or, with
//   probability 1/4, causal within a sliding window of 4096 tokens (a data
//   source trained with local attention, as Mistral-style sliding windows).
//
// Step s of rank r depends only on (seed, s, r), as in DataStream: not on the
// world size, so any step can be generated alone and every run is
// reproducible. Thread-compatible; Batch is const.
class MaskedStream {
 public:
  enum class Kind { kVideoBlockCausal, kInterleaved, kLlmPacked };

  struct Step {
    RankLengths lengths;
    RankMasks masks;  // one mask per sequence, on every rank
  };

  // InvalidArgument unless `name` is one of MaskedScenarioNames() and
  // 1 <= world_size <= 2^20.
  static absl::StatusOr<MaskedStream> Create(absl::string_view name, int64_t world_size,
                                             uint64_t seed);

  Step Batch(int64_t step) const;
  Kind kind() const { return kind_; }
  int64_t world_size() const { return world_size_; }

 private:
  MaskedStream(Kind kind, int64_t world_size, uint64_t seed)
      : kind_(kind), world_size_(world_size), seed_(seed) {}

  Kind kind_;
  int64_t world_size_;
  uint64_t seed_;
};

// The documented choices above, for tests and docs.
namespace masked_data {
inline constexpr int64_t kVideoResolutions[] = {256, 512, 768, 1024};
inline constexpr int64_t kVideoMinFrames = 16;
inline constexpr int64_t kVideoMaxFrames = 128;
inline constexpr int64_t kVideoMaxClipTokens = 131072;
inline constexpr int64_t kVideoChunkFrames = 6;
inline constexpr int64_t kVideoMaxClips = 4;
inline constexpr int64_t kCaptionMin = 32;
inline constexpr int64_t kCaptionMax = 256;
inline constexpr int64_t kInterleavedMinSamples = 4;
inline constexpr int64_t kInterleavedMaxSamples = 16;
inline constexpr int64_t kInterleavedMaxImages = 16;
inline constexpr int64_t kImageTokens[] = {256, 1024, 4096};
inline constexpr double kTextMedian = 192;
inline constexpr double kTextSigma = 1.5;
inline constexpr int64_t kTextMin = 4;
inline constexpr int64_t kTextMax = 16384;
inline constexpr int64_t kLlmRankTokens = 131072;
inline constexpr double kLlmMedian = 2048;
inline constexpr double kLlmSigma = 1.75;
inline constexpr int64_t kLlmMinDocument = 32;
inline constexpr int64_t kLlmOneInWindowed = 4;
inline constexpr int64_t kLlmWindow = 4096;
}  // namespace masked_data

// "video-blockcausal", "interleaved", "llm-packed".
std::vector<std::string> MaskedScenarioNames();
bool IsMaskedScenario(absl::string_view name);
// One line on what the stream holds (for the CLI's header); "" for an
// unknown name.
std::string MaskedScenarioSummary(absl::string_view name);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MASKED_STREAM_H_
