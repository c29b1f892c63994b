#include "client/step_requests.h"

#include <utility>

#include "proto/mask_proto.h"

namespace knapformer {

v1::StepSpec WithIncarnation(const v1::StepSpec& spec, uint64_t incarnation) {
  v1::StepSpec out = spec;
  if (spec.incarnation() == 0) out.set_incarnation(incarnation);
  return out;
}

v1::PlanRequest RankRequest(const v1::StepSpec& spec, uint64_t incarnation, int rank,
                            const std::vector<int64_t>& lengths,
                            const std::vector<AttentionMask>& masks,
                            const v1::StepTiming* previous) {
  v1::PlanRequest request;
  *request.mutable_spec() = WithIncarnation(spec, incarnation);
  request.set_rank(rank);
  request.mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
  for (const AttentionMask& mask : masks) MaskToProto(mask, request.add_attention_masks());
  if (previous != nullptr) *request.mutable_previous() = *previous;
  return request;
}

v1::PlanGroupRequest GroupRequests::Request(const v1::StepSpec& spec, uint64_t incarnation,
                                            const Gathered& gathered,
                                            const std::vector<double>& rank_speeds) const {
  v1::PlanGroupRequest request;
  *request.mutable_spec() = WithIncarnation(spec, incarnation);
  request.mutable_rank_speeds()->Add(rank_speeds.begin(), rank_speeds.end());
  request.mutable_ranks()->Reserve(static_cast<int>(gathered.lengths.size()));
  for (size_t r = 0; r < gathered.lengths.size(); ++r) {
    v1::RankLengths* rank = request.add_ranks();
    rank->mutable_sequence_lengths()->Add(gathered.lengths[r].begin(), gathered.lengths[r].end());
    if (gathered.masks.empty()) continue;
    for (const AttentionMask& mask : gathered.masks[r]) {
      MaskToProto(mask, rank->add_attention_masks());
    }
  }
  if (gathered.any_timing) {
    for (size_t r = 0; r < gathered.timings.size(); ++r) {
      v1::StepTiming* timing = request.add_previous();
      *timing = gathered.timings[r];
      if (timing->compute_seconds() <= 0) continue;
      for (const StepWork& kept : recent_work_) {
        if (kept.step != timing->step() || r >= kept.work.size()) continue;
        timing->set_linear_work(kept.work[r].linear);
        timing->set_attention_work(kept.work[r].attention);
        timing->clear_attention_by_pair_point();
        if (r < kept.weights.size()) {
          timing->mutable_attention_by_pair_point()->Add(kept.weights[r].begin(),
                                                         kept.weights[r].end());
        }
      }
    }
  }
  return request;
}

void GroupRequests::KeepWork(const v1::StepSpec& spec, const Gathered& gathered,
                             const StepPlan& step, bool keep, bool from_the_start) {
  if (gathered.any_timing) ranks_send_timings_ = true;
  if (!keep || !(ranks_send_timings_ || from_the_start) || step.whole == nullptr) return;
  const RankMasks* masks = gathered.masks.empty() ? nullptr : &gathered.masks;
  StepWork kept{spec.step(), RankWork(*step.whole, spec.d_model(), masks), {}};
  if (spec.cost_model() == v1::COST_MODEL_MEASURED && spec.use_fitted_gamma()) {
    kept.weights = RankPairWeights(*step.whole, masks);
  }
  recent_work_.push_back(std::move(kept));
  while (recent_work_.size() > kKeptSteps) recent_work_.pop_front();
}

const std::vector<WorkSample>* GroupRequests::WorkOf(uint64_t step) const {
  for (const StepWork& kept : recent_work_) {
    if (kept.step == step) return &kept.work;
  }
  return nullptr;
}

}  // namespace knapformer
