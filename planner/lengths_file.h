#ifndef KNAPFORMER_PLANNER_LENGTHS_FILE_H_
#define KNAPFORMER_PLANNER_LENGTHS_FILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"

namespace knapformer {

// A user's own data, as `simulate --lengths` and `replay --lengths` take it:
// a text file with one sample per line, its token count and optionally its
// attention mask in MaskText's form (attention_mask.h), comma-separated:
//
//   # tokens[,mask]      (lines starting with '#', and blank lines, are skipped)
//   4096
//   1300,causal
//   8192,spans=256:c;7936:f
//
// A header line "tokens" or "tokens,mask" is skipped too. Every sample has
// at least one token and fewer than 2^31; a sample without a mask attends
// fully.
struct LengthSample {
  int64_t tokens = 0;
  std::optional<AttentionMask> mask;
};

struct LengthsFile {
  // The most samples one file may hold (checked while reading, before they
  // are kept): 16M lines, at most about 1 GiB of samples in memory (64
  // bytes each, spans of masks besides).
  static constexpr int64_t kMaxSamples = int64_t{1} << 24;
  static constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;

  std::vector<LengthSample> samples;
  int64_t masked = 0;  // samples that carry a mask

  // Samples of more than `tokens` tokens (a token budget's lone batches).
  int64_t SamplesLongerThan(int64_t tokens) const;
};

// Parses the text of a lengths file named `name` (for messages).
// InvalidArgument "NAME:LINE: FIELD: what is wrong" for the first bad line
// (FIELD is tokens or mask), or when it holds no sample or too many.
absl::StatusOr<LengthsFile> ParseLengthsFile(absl::string_view text, const std::string& name);

// How the user's loader makes each GPU's micro-batch from its shard: a fixed
// number of samples, or samples in order while their tokens fit a budget (a
// sample longer than the budget alone). Exactly one is > 0.
struct LoaderBatching {
  int64_t samples_per_gpu = 0;
  int64_t tokens_per_gpu = 0;
  // "4 samples per GPU" or "up to 65536 tokens per GPU".
  std::string ToString() const;
};

// The per-step batches a distributed loader draws from a lengths file, as
// torch's DistributedSampler with shuffle deals them: each epoch is a seeded
// permutation of the samples (the file's order with shuffle off), padded by
// wrapping to a multiple of the world size; rank r's shard is positions r,
// r + W, r + 2W, ...; epochs follow one another without end. Each rank then
// batches its shard (LoaderBatching). Step s of a samples-per-GPU stream is
// computed alone; a token-budget stream is read in order (a step before the
// last one read replays the stream from step 0). Not thread-safe.
class LengthsStream {
 public:
  struct Step {
    RankLengths lengths;
    RankMasks masks;  // empty unless the file has masks; then one per sequence
  };

  // InvalidArgument naming the bad argument: world_size in [1, 2^20],
  // exactly one of the batching's fields > 0.
  static absl::StatusOr<LengthsStream> Create(LengthsFile file, int64_t world_size,
                                              LoaderBatching batching, uint64_t seed,
                                              bool shuffle);

  Step Batch(int64_t step);
  int64_t world_size() const { return world_size_; }
  const LengthsFile& file() const { return file_; }
  // The file's samples longer than the token budget (each is batched
  // alone); 0 when batching by count.
  int64_t samples_over_budget() const {
    return batching_.tokens_per_gpu > 0 ? file_.SamplesLongerThan(batching_.tokens_per_gpu) : 0;
  }

 private:
  LengthsStream(LengthsFile file, int64_t world_size, LoaderBatching batching, uint64_t seed,
                bool shuffle);

  // The sample at position k of rank's shard (k counts over epochs).
  const LengthSample& ShardSample(int64_t rank, int64_t k);
  // Epoch e's order of the samples. The last few epochs asked for are
  // cached: a step's ranks (and token-budget shards, which drift apart)
  // read from neighbouring epochs.
  const std::vector<int32_t>& EpochOrder(int64_t epoch);
  void Append(const LengthSample& sample, int64_t rank, Step* step) const;

  LengthsFile file_;
  int64_t world_size_;
  LoaderBatching batching_;
  uint64_t seed_;
  bool shuffle_;
  int64_t shard_size_;  // ceil(samples / world): one epoch of a shard
  std::map<int64_t, std::vector<int32_t>> orders_;
  // Token budget: the next step to read and each rank's next shard position.
  int64_t next_step_ = 0;
  std::vector<int64_t> cursor_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_LENGTHS_FILE_H_
