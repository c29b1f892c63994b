#include "planner/lengths_file.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner/splitmix64.h"

namespace knapformer {
namespace {

constexpr int64_t kMaxWorld = int64_t{1} << 20;

absl::Status LineError(const std::string& name, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": ", what));
}

}  // namespace

absl::StatusOr<LengthsFile> ParseLengthsFile(absl::string_view text, const std::string& name) {
  LengthsFile file;
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // "\r" of a CRLF file too
    if (line.empty() || line.front() == '#') continue;
    if (file.samples.empty() && (line == "tokens" || line == "tokens,mask")) continue;
    if (static_cast<int64_t>(file.samples.size()) == LengthsFile::kMaxSamples) {
      return LineError(name, line_number,
                       absl::StrCat("more than ", LengthsFile::kMaxSamples,
                                    " samples (the limit of one file)"));
    }
    const size_t comma = line.find(',');
    const absl::string_view tokens_text = absl::StripAsciiWhitespace(line.substr(0, comma));
    LengthSample sample;
    if (!absl::SimpleAtoi(tokens_text, &sample.tokens)) {
      return LineError(name, line_number,
                       absl::StrCat("tokens: '", tokens_text,
                                    "' is not a whole number (a line is tokens[,mask])"));
    }
    if (sample.tokens < 1 || sample.tokens > LengthsFile::kMaxTokens) {
      return LineError(name, line_number,
                       absl::StrCat("tokens: ", sample.tokens, " is outside [1, ",
                                    LengthsFile::kMaxTokens, "]"));
    }
    if (comma != absl::string_view::npos) {
      const std::string mask_text(absl::StripAsciiWhitespace(line.substr(comma + 1)));
      absl::StatusOr<AttentionMask> mask = ParseMaskText(mask_text, "mask");
      if (!mask.ok()) return LineError(name, line_number, mask.status().message());
      if (absl::Status valid = CheckMask(sample.tokens, *mask, "mask"); !valid.ok()) {
        return LineError(name, line_number, valid.message());
      }
      sample.mask = *std::move(mask);
      ++file.masked;
    }
    file.samples.push_back(std::move(sample));
  }
  if (file.samples.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": no samples (one line per sample: tokens[,mask])"));
  }
  return file;
}

int64_t LengthsFile::SamplesLongerThan(int64_t tokens) const {
  int64_t longer = 0;
  for (const LengthSample& sample : samples) longer += sample.tokens > tokens ? 1 : 0;
  return longer;
}

std::string LoaderBatching::ToString() const {
  return samples_per_gpu > 0 ? absl::StrCat(samples_per_gpu, " samples per GPU")
                             : absl::StrCat("up to ", tokens_per_gpu, " tokens per GPU");
}

absl::StatusOr<LengthsStream> LengthsStream::Create(LengthsFile file, int64_t world_size,
                                                    LoaderBatching batching, uint64_t seed,
                                                    bool shuffle) {
  if (world_size < 1 || world_size > kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("world: ", world_size, " is outside [1, ", kMaxWorld, "]"));
  }
  if ((batching.samples_per_gpu > 0) == (batching.tokens_per_gpu > 0) ||
      batching.samples_per_gpu < 0 || batching.tokens_per_gpu < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "samples_per_gpu / tokens_per_gpu: exactly one must be > 0 (how the loader batches), "
        "got ", batching.samples_per_gpu, " / ", batching.tokens_per_gpu));
  }
  if (file.samples.empty()) {
    return absl::InvalidArgumentError("lengths: no samples");
  }
  return LengthsStream(std::move(file), world_size, batching, seed, shuffle);
}

LengthsStream::LengthsStream(LengthsFile file, int64_t world_size, LoaderBatching batching,
                             uint64_t seed, bool shuffle)
    : file_(std::move(file)),
      world_size_(world_size),
      batching_(batching),
      seed_(seed),
      shuffle_(shuffle) {
  const int64_t n = static_cast<int64_t>(file_.samples.size());
  shard_size_ = (n + world_size_ - 1) / world_size_;
}

const std::vector<int32_t>& LengthsStream::EpochOrder(int64_t epoch) {
  if (auto cached = orders_.find(epoch); cached != orders_.end()) return cached->second;
  constexpr size_t kCachedEpochs = 4;
  if (orders_.size() == kCachedEpochs) orders_.erase(orders_.begin());  // the oldest
  std::vector<int32_t>& order = orders_[epoch];
  order.resize(file_.samples.size());
  std::iota(order.begin(), order.end(), 0);
  if (shuffle_) {
    // Fisher-Yates from (seed, epoch), as the sampler's set_epoch does.
    SplitMix64 rng(seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1)));
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);
  }
  return order;
}

const LengthSample& LengthsStream::ShardSample(int64_t rank, int64_t k) {
  const int64_t epoch = k / shard_size_;
  const int64_t position = rank + (k % shard_size_) * world_size_;
  const std::vector<int32_t>& order = EpochOrder(epoch);
  // Padded by wrapping: a position past the end takes the epoch's first ones.
  return file_.samples[order[position % static_cast<int64_t>(order.size())]];
}

void LengthsStream::Append(const LengthSample& sample, int64_t rank, Step* step) const {
  step->lengths[rank].push_back(sample.tokens);
  if (file_.masked > 0) step->masks[rank].push_back(sample.mask.value_or(AttentionMask::Full()));
}

LengthsStream::Step LengthsStream::Batch(int64_t step) {
  Step out;
  out.lengths.resize(world_size_);
  if (file_.masked > 0) out.masks.resize(world_size_);
  if (batching_.samples_per_gpu > 0) {
    const int64_t b = batching_.samples_per_gpu;
    for (int64_t rank = 0; rank < world_size_; ++rank) {
      for (int64_t i = 0; i < b; ++i) Append(ShardSample(rank, step * b + i), rank, &out);
    }
    return out;
  }
  if (step < next_step_ || cursor_.empty()) {  // replay from the start
    cursor_.assign(world_size_, 0);
    next_step_ = 0;
  }
  const int64_t budget = batching_.tokens_per_gpu;
  for (; next_step_ <= step; ++next_step_) {
    const bool keep = next_step_ == step;
    for (int64_t rank = 0; rank < world_size_; ++rank) {
      int64_t tokens = 0;
      int64_t taken = 0;
      while (true) {
        const LengthSample& sample = ShardSample(rank, cursor_[rank]);
        if (taken > 0 && tokens + sample.tokens > budget) break;
        tokens += sample.tokens;
        ++taken;
        ++cursor_[rank];
        if (keep) Append(sample, rank, &out);
        if (tokens >= budget) break;
      }
    }
  }
  return out;
}

}  // namespace knapformer
