#include "server/request_check.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/measured_fit.h"
#include "planner/rank_speeds.h"
#include "proto/mask_proto.h"
#include "proto/plan_proto.h"

namespace knapformer {
namespace {

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
}

absl::Status CheckId(const char* field, const std::string& id, bool may_be_empty) {
  if (id.empty() && !may_be_empty) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  }
  if (static_cast<int64_t>(id.size()) > kMaxIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", id.size(),
                                                   " characters exceed the limit of ",
                                                   kMaxIdLength));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    if (!IsIdChar(id[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": character ", i, " is not one of [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

// Lengths of one rank: count within the per-rank limit, each in [0, kMaxLength].
template <typename Lengths>
absl::Status CheckLengths(const std::string& field, const Lengths& lengths,
                          const ServiceLimits& limits) {
  if (lengths.size() > limits.max_sequences_per_rank) {
    return absl::ResourceExhaustedError(absl::StrCat(field, ": ", lengths.size(),
                                                     " sequences exceed the limit of ",
                                                     limits.max_sequences_per_rank,
                                                     " per rank"));
  }
  for (int i = 0; i < lengths.size(); ++i) {
    const int64_t length = lengths.Get(i);
    if (length < 0 || length > CostModel::kMaxLength) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", length,
                                                     " is outside [0, ",
                                                     CostModel::kMaxLength, "]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobId(const std::string& job_id) {
  KF_RETURN_IF_ERROR(CheckId("spec.job_id", job_id, /*may_be_empty=*/false));
  if (job_id.back() == '/') {
    // Tokens and certificates scope "NS/" to every job under it: a job of
    // that name would be the scope itself.
    return absl::InvalidArgumentError(
        "spec.job_id: ends in '/' (a job id never does: 'NS/' names the jobs under it)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const World>> WorldCache::Get(const std::string& topology,
                                                             int32_t world_size) {
  auto key = std::make_pair(topology, world_size);
  {
    absl::MutexLock lock(&mu_);
    auto it = worlds_.find(key);
    if (it != worlds_.end()) return it->second;
  }
  KF_ASSIGN_OR_RETURN(std::shared_ptr<const World> world, FixedWorldOf(topology, world_size));
  absl::MutexLock lock(&mu_);
  if (worlds_.size() >= capacity_) worlds_.clear();
  worlds_.emplace(std::move(key), world);
  return world;
}

absl::StatusOr<CheckedSpec> CheckStepSpec(const v1::StepSpec& spec, const ServiceLimits& limits,
                                          WorldCache* cache) {
  KF_RETURN_IF_ERROR(CheckJobId(spec.job_id()));
  KF_RETURN_IF_ERROR(CheckId("spec.group_id", spec.group_id(), /*may_be_empty=*/true));
  if (spec.world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.world_size: must be at least 1, got ", spec.world_size()));
  }
  if (spec.world_size() > limits.max_world_size) {
    return absl::ResourceExhaustedError(absl::StrCat("spec.world_size: ", spec.world_size(),
                                                     " exceeds the server's limit of ",
                                                     limits.max_world_size, " ranks"));
  }
  if (spec.token_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.token_bytes: must be >= 0, got ", spec.token_bytes()));
  }
  if (spec.max_tokens_per_gpu() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.max_tokens_per_gpu: must be >= 0 (0 = no cap), got ", spec.max_tokens_per_gpu()));
  }
  std::shared_ptr<const World> world;
  if (cache != nullptr && !AutoLayout::Matches(spec.topology())) {
    KF_ASSIGN_OR_RETURN(world, cache->Get(spec.topology(), spec.world_size()));
  }
  KF_ASSIGN_OR_RETURN(CheckedSpec checked, StepProblemOf(spec, std::move(world)));
  KF_RETURN_IF_ERROR(CheckLocality(spec));
  return checked;
}

namespace {

absl::Status CheckTiming(const std::string& field, const v1::StepTiming& timing) {
  const double seconds = timing.compute_seconds();
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".compute_seconds: must be a finite number in [0, 1e6], got ", seconds));
  }
  const std::pair<const char*, double> works[] = {{"linear_work", timing.linear_work()},
                                                  {"attention_work", timing.attention_work()}};
  for (const auto& [name, work] : works) {
    if (!std::isfinite(work) || work < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".", name, ": must be a finite number >= 0, got ", work));
    }
  }
  const auto& weights = timing.attention_by_pair_point();
  if (!weights.empty() && weights.size() != kPairGridPoints) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".attention_by_pair_point: ", weights.size(),
                     " values; empty, or one per grid point (", kPairGridPoints, ")"));
  }
  for (int j = 0; j < weights.size(); ++j) {
    if (!std::isfinite(weights[j]) || weights[j] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".attention_by_pair_point[", j,
                                                     "]: must be a finite number >= 0, got ",
                                                     weights[j]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckedSpec> CheckPlanRequestRank(const v1::PlanRequest& request,
                                                 const ServiceLimits& limits, WorldCache* cache) {
  KF_ASSIGN_OR_RETURN(CheckedSpec checked, CheckStepSpec(request.spec(), limits, cache));
  if (request.rank() < 0 || request.rank() >= request.spec().world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank: ", request.rank(),
                                                   " is outside [0, world_size = ",
                                                   request.spec().world_size(), ")"));
  }
  return checked;
}

absl::Status CheckRankInput(const v1::PlanRequest& request, const ServiceLimits& limits) {
  KF_RETURN_IF_ERROR(CheckLengths("sequence_lengths", request.sequence_lengths(), limits));
  KF_RETURN_IF_ERROR(
      CheckProtoMasks(request.attention_masks(), request.sequence_lengths(), "attention_masks"));
  return CheckTiming("previous", request.previous());
}

absl::StatusOr<CheckedSpec> CheckPlanRequest(const v1::PlanRequest& request,
                                             const ServiceLimits& limits, WorldCache* cache) {
  KF_ASSIGN_OR_RETURN(CheckedSpec checked, CheckPlanRequestRank(request, limits, cache));
  KF_RETURN_IF_ERROR(CheckRankInput(request, limits));
  return checked;
}

absl::StatusOr<CheckedGroupRequest> CheckPlanGroupRequest(
    const v1::PlanGroupRequest& request, const ServiceLimits& limits,
    const BalancerLimits& balancer_limits, WorldCache* cache) {
  KF_ASSIGN_OR_RETURN(CheckedSpec checked, CheckStepSpec(request.spec(), limits, cache));
  if (request.ranks_size() != request.spec().world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("ranks: ", request.ranks_size(),
                                                   " entries, but world_size is ",
                                                   request.spec().world_size()));
  }
  int64_t sequences = 0;
  for (int r = 0; r < request.ranks_size(); ++r) {
    const auto& lengths = request.ranks(r).sequence_lengths();
    KF_RETURN_IF_ERROR(
        CheckLengths(absl::StrCat("ranks[", r, "].sequence_lengths"), lengths, limits));
    sequences += lengths.size();
  }
  if (sequences > limits.max_sequences_per_step) {
    return absl::ResourceExhaustedError(absl::StrCat("ranks: ", sequences,
                                                     " sequences exceed the limit of ",
                                                     limits.max_sequences_per_step,
                                                     " per step"));
  }
  if (request.previous_size() != 0 && request.previous_size() != request.spec().world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("previous: ", request.previous_size(),
                                                   " entries; give none or world_size = ",
                                                   request.spec().world_size()));
  }
  for (int r = 0; r < request.previous_size(); ++r) {
    KF_RETURN_IF_ERROR(CheckTiming(absl::StrCat("previous[", r, "]"), request.previous(r)));
  }
  std::vector<double> speeds(request.rank_speeds().begin(), request.rank_speeds().end());
  KF_RETURN_IF_ERROR(CheckRankSpeeds(speeds, request.spec().world_size(), "rank_speeds"));
  // Each rank's masks, that they are given on every rank or none, and the
  // whole step as the solve takes it: checked here, once.
  KF_ASSIGN_OR_RETURN(
      BalancerInput input,
      BalancerInputFromProto(
          request.ranks_size(),
          [&](int32_t r) -> const ProtoLengths& { return request.ranks(r).sequence_lengths(); },
          [&](int32_t r) -> const ProtoMasks& { return request.ranks(r).attention_masks(); },
          [](int32_t r) { return absl::StrCat("ranks[", r, "].attention_masks"); },
          balancer_limits));
  return CheckedGroupRequest{std::move(checked), std::move(input), std::move(speeds)};
}

}  // namespace knapformer
