#include "tools/sim_data.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

int64_t Scaled(int64_t length, int64_t scale) { return std::max<int64_t>(1, length / scale); }

// A sequence's length and mask divided by `scale`; spans keep their count.
void ScaleMasked(int64_t scale, int64_t& length, AttentionMask& mask) {
  switch (mask.kind) {
    case AttentionMask::Kind::kSpans:
      length = 0;
      for (MaskSpan& span : mask.spans) {
        span.length = Scaled(span.length, scale);
        length += span.length;
      }
      return;
    case AttentionMask::Kind::kWindow:
      mask.window = Scaled(mask.window, scale);
      break;
    case AttentionMask::Kind::kFull:
    case AttentionMask::Kind::kCausal:
      break;
  }
  length = Scaled(length, scale);
}

}  // namespace

absl::StatusOr<SimData> SimData::Create(const std::string& data, int64_t procs, uint64_t seed,
                                        int64_t scale) {
  SimData sim;
  sim.scale_ = scale;
  if (IsMaskedScenario(data)) {
    absl::StatusOr<MaskedStream> stream = MaskedStream::Create(data, procs, seed);
    if (!stream.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--data: ", stream.status().message()));
    }
    sim.masked_ = *std::move(stream);
    return sim;
  }
  const std::string scenario = ScenarioCodes(data);
  absl::StatusOr<std::vector<DataCode>> codes = ParseDataCodes(scenario.empty() ? data : scenario);
  if (!codes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--data: ", codes.status().message()));
  }
  absl::StatusOr<DataStream> stream = DataStream::Create(*codes, procs, seed);
  if (!stream.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data/--procs: ", stream.status().message()));
  }
  sim.paper_ = *std::move(stream);
  return sim;
}

SimData::Batch SimData::At(int64_t step) const {
  Batch batch;
  if (masked_.has_value()) {
    MaskedStream::Step drawn = masked_->Batch(step);
    batch.lengths = std::move(drawn.lengths);
    batch.masks = std::move(drawn.masks);
    for (size_t r = 0; r < batch.lengths.size(); ++r) {
      for (size_t i = 0; i < batch.lengths[r].size(); ++i) {
        ScaleMasked(scale_, batch.lengths[r][i], batch.masks[r][i]);
      }
    }
    return batch;
  }
  batch.lengths = paper_->Batch(step);
  for (auto& rank : batch.lengths) {
    for (int64_t& length : rank) length = Scaled(length, scale_);
  }
  return batch;
}

std::vector<AttentionMask> HeldMasks(const RankPlan& plan, const RankMasks& masks) {
  std::vector<AttentionMask> held;
  if (masks.empty()) return held;
  if (plan.ulysses.gpus > 1) {
    for (const UlyssesSequence& seq : plan.ulysses.sequences) {
      held.push_back(masks[seq.src_rank][seq.seq_index]);
    }
  } else {
    for (const Transfer& chunk : plan.route.recvs) {
      held.push_back(masks[chunk.peer][chunk.seq_index]);
    }
  }
  return held;
}

}  // namespace knapformer
