#include "proto/plan_proto.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

#include "planner/balance_stats.h"
#include "proto/mask_proto.h"

namespace knapformer {

absl::StatusOr<CostKind> CostKindFromProto(int value) {
  switch (value) {
    case v1::COST_MODEL_TRANSFORMER:
      return CostKind::kTransformer;
    case v1::COST_MODEL_UNIFORM:
      return CostKind::kUniform;
    case v1::COST_MODEL_LINEAR:
      return CostKind::kLinear;
    case v1::COST_MODEL_MEASURED:
      return CostKind::kMeasured;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.cost_model: unknown value ", value,
                       " (0 transformer, 1 uniform, 2 linear, 3 measured)"));
  }
}

void MeasuredAttentionToProto(const MeasuredAttention& table, v1::MeasuredAttention* out) {
  out->mutable_pairs()->Assign(table.pairs().begin(), table.pairs().end());
  out->mutable_work()->Assign(table.work().begin(), table.work().end());
}

absl::StatusOr<MeasuredAttention> MeasuredAttentionFromProto(const v1::MeasuredAttention& table,
                                                             const std::string& field) {
  return MeasuredAttention::Create({table.pairs().begin(), table.pairs().end()},
                                   {table.work().begin(), table.work().end()}, field);
}

absl::StatusOr<CostModel> CostModelFromSpec(const v1::StepSpec& spec) {
  absl::StatusOr<CostKind> kind = CostKindFromProto(spec.cost_model());
  if (!kind.ok()) return kind.status();
  std::optional<MeasuredAttention> measured;
  if (spec.has_measured_attention()) {
    absl::StatusOr<MeasuredAttention> created =
        MeasuredAttentionFromProto(spec.measured_attention(), "spec.measured_attention");
    if (!created.ok()) return created.status();
    measured = *std::move(created);
  }
  absl::StatusOr<CostModel> cost = CostModel::Create(spec.d_model(), spec.gamma(), *kind,
                                                     measured ? &*measured : nullptr);
  if (!cost.ok()) {
    return absl::Status(cost.status().code(), absl::StrCat("spec.", cost.status().message()));
  }
  return cost;
}

absl::StatusOr<Machine> MachineFromSpec(const v1::StepSpec& spec) {
  Machine machine;
  const v1::Machine& given = spec.machine();
  if (given.flops_per_second() != 0) machine.flops_per_second = given.flops_per_second();
  if (given.intra_node_bytes_per_second() != 0) {
    machine.intra_node_bytes_per_second = given.intra_node_bytes_per_second();
  }
  if (given.inter_node_bytes_per_second() != 0) {
    machine.inter_node_bytes_per_second = given.inter_node_bytes_per_second();
  }
  if (given.gpus_per_node() != 0) machine.gpus_per_node = given.gpus_per_node();
  if (given.element_bytes() != 0) machine.element_bytes = given.element_bytes();
  if (given.blocks_per_route() != 0) machine.blocks_per_route = given.blocks_per_route();
  if (absl::Status status = CheckMachine(machine, "spec.machine"); !status.ok()) return status;
  return machine;
}

void MachineToProto(const Machine& machine, v1::Machine* out) {
  out->set_flops_per_second(machine.flops_per_second);
  out->set_intra_node_bytes_per_second(machine.intra_node_bytes_per_second);
  out->set_inter_node_bytes_per_second(machine.inter_node_bytes_per_second);
  out->set_gpus_per_node(machine.gpus_per_node);
  out->set_element_bytes(machine.element_bytes);
  out->set_blocks_per_route(machine.blocks_per_route);
}

absl::Status CheckLocality(const v1::StepSpec& spec) {
  switch (spec.locality()) {
    case v1::LOCALITY_PLANNER_DEFAULT:
    case v1::LOCALITY_ON:
    case v1::LOCALITY_OFF:
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("spec.locality: unknown value ",
                                                     spec.locality(),
                                                     " (0 planner default, 1 on, 2 off)"));
  }
}

BalancerOptions BalancerOptionsForSpec(BalancerOptions base, const v1::StepSpec& spec) {
  base.max_tokens_per_gpu = spec.max_tokens_per_gpu();
  if (spec.locality() == v1::LOCALITY_ON) base.locality = true;
  if (spec.locality() == v1::LOCALITY_OFF) base.locality = false;
  return base;
}

v1::CostModel CostKindToProto(CostKind kind) {
  switch (kind) {
    case CostKind::kUniform:
      return v1::COST_MODEL_UNIFORM;
    case CostKind::kLinear:
      return v1::COST_MODEL_LINEAR;
    case CostKind::kMeasured:
      return v1::COST_MODEL_MEASURED;
    case CostKind::kTransformer:
      break;
  }
  return v1::COST_MODEL_TRANSFORMER;
}
namespace {

void TransfersToProto(const std::vector<Transfer>& transfers, v1::Transfers* out) {
  const int n = static_cast<int>(transfers.size());
  out->mutable_peer()->Reserve(n);
  out->mutable_seq_index()->Reserve(n);
  out->mutable_offset()->Reserve(n);
  out->mutable_length()->Reserve(n);
  for (const Transfer& t : transfers) {
    out->add_peer(t.peer);
    out->add_seq_index(t.seq_index);
    out->add_offset(t.offset);
    out->add_length(t.length);
  }
}

absl::StatusOr<std::vector<Transfer>> TransfersFromProto(const v1::Transfers& proto,
                                                        const char* field) {
  const int n = proto.peer_size();
  if (proto.seq_index_size() != n || proto.offset_size() != n || proto.length_size() != n) {
    return absl::InternalError(absl::StrCat(
        "plan.", field, ": columns of different lengths (peer ", n, ", seq_index ",
        proto.seq_index_size(), ", offset ", proto.offset_size(), ", length ",
        proto.length_size(), ")"));
  }
  std::vector<Transfer> transfers(n);
  for (int i = 0; i < n; ++i) {
    transfers[i] = Transfer{proto.peer(i), proto.seq_index(i), proto.offset(i), proto.length(i)};
  }
  return transfers;
}

}  // namespace

v1::Balance BalanceToProto(const Plan& plan, int64_t token_bytes, int64_t plan_micros) {
  const BalanceStats before = ComputeBalanceStats(plan.workload_before);
  const BalanceStats after = ComputeBalanceStats(plan.workload_after);
  v1::Balance balance;
  balance.set_wir_before(before.wir);
  balance.set_wir_after(after.wir);
  balance.set_max_over_mean_before(before.max_over_mean);
  balance.set_max_over_mean_after(after.max_over_mean);
  balance.set_total_tokens(plan.TotalTokens());
  balance.set_moved_tokens(plan.MovedTokens());
  balance.set_moved_bytes(plan.MovedBytes(token_bytes));
  balance.set_plan_micros(plan_micros);
  balance.set_layout(plan.topology);
  std::map<int32_t, int32_t> gpus_by_size;
  for (int32_t gpus : plan.bag_gpus) gpus_by_size[gpus] += gpus;
  for (const auto& [bag_gpus, gpus] : gpus_by_size) {
    v1::BagSizeGpus* entry = balance.add_gpus_by_bag_size();
    entry->set_bag_gpus(bag_gpus);
    entry->set_gpus(gpus);
  }
  return balance;
}

void RankPlanToProto(const RankPlan& rank_plan, v1::RankPlan* out) {
  out->set_rank(rank_plan.rank);
  TransfersToProto(rank_plan.route.sends, out->mutable_sends());
  TransfersToProto(rank_plan.route.recvs, out->mutable_recvs());
  v1::UlyssesBag* bag = out->mutable_ulysses();
  bag->set_first_rank(rank_plan.ulysses.first_rank);
  bag->set_gpus(rank_plan.ulysses.gpus);
  bag->set_position(rank_plan.ulysses.position);
  for (const UlyssesSequence& s : rank_plan.ulysses.sequences) {
    v1::UlyssesSequence* seq = bag->add_sequences();
    seq->set_src_rank(s.src_rank);
    seq->set_seq_index(s.seq_index);
    seq->set_length(s.length);
    seq->mutable_chunk_lengths()->Add(s.chunk_lengths.begin(), s.chunk_lengths.end());
  }
  out->set_workload_before(rank_plan.workload_before);
  out->set_workload_after(rank_plan.workload_after);
  out->mutable_attention_masks()->Reserve(static_cast<int>(rank_plan.attention_masks.size()));
  for (const AttentionMask& mask : rank_plan.attention_masks) {
    MaskToProto(mask, out->add_attention_masks());
  }
}

void ChunksToProto(const Plan& plan, v1::Chunks* out) {
  const int n = static_cast<int>(plan.chunks.size());
  out->mutable_src_rank()->Reserve(n);
  out->mutable_seq_index()->Reserve(n);
  out->mutable_offset()->Reserve(n);
  out->mutable_length()->Reserve(n);
  out->mutable_dst_rank()->Reserve(n);
  for (const Chunk& c : plan.chunks) {
    out->add_src_rank(c.src_rank);
    out->add_seq_index(c.seq_index);
    out->add_offset(c.offset);
    out->add_length(c.length);
    out->add_dst_rank(c.dst_rank);
  }
}

absl::StatusOr<std::vector<Chunk>> ChunksFromProto(const v1::Chunks& proto) {
  const int n = proto.src_rank_size();
  if (proto.seq_index_size() != n || proto.offset_size() != n || proto.length_size() != n ||
      proto.dst_rank_size() != n) {
    return absl::InternalError(absl::StrCat(
        "chunks: columns of different lengths (src_rank ", n, ", seq_index ",
        proto.seq_index_size(), ", offset ", proto.offset_size(), ", length ",
        proto.length_size(), ", dst_rank ", proto.dst_rank_size(), ")"));
  }
  std::vector<Chunk> chunks(n);
  for (int i = 0; i < n; ++i) {
    chunks[i] = Chunk{proto.src_rank(i), proto.seq_index(i), proto.offset(i), proto.length(i),
                      proto.dst_rank(i)};
  }
  return chunks;
}

absl::StatusOr<RankPlan> RankPlanFromProto(const v1::RankPlan& proto, int32_t world_size) {
  RankPlan plan;
  plan.rank = proto.rank();
  plan.world_size = world_size;
  absl::StatusOr<std::vector<Transfer>> sends = TransfersFromProto(proto.sends(), "sends");
  if (!sends.ok()) return sends.status();
  absl::StatusOr<std::vector<Transfer>> recvs = TransfersFromProto(proto.recvs(), "recvs");
  if (!recvs.ok()) return recvs.status();
  plan.route.sends = *std::move(sends);
  plan.route.recvs = *std::move(recvs);
  for (const Transfer& t : plan.route.recvs) plan.compute_chunk_lengths.push_back(t.length);
  plan.ulysses.first_rank = proto.ulysses().first_rank();
  plan.ulysses.gpus = proto.ulysses().gpus();
  plan.ulysses.position = proto.ulysses().position();
  for (const v1::UlyssesSequence& s : proto.ulysses().sequences()) {
    if (s.chunk_lengths_size() > world_size) {
      return absl::InternalError(absl::StrCat("plan.ulysses: a sequence has ",
                                              s.chunk_lengths_size(),
                                              " chunk lengths, more than the ", world_size,
                                              " ranks"));
    }
    plan.ulysses.sequences.push_back(UlyssesSequence{
        s.src_rank(), s.seq_index(), s.length(),
        std::vector<int64_t>(s.chunk_lengths().begin(), s.chunk_lengths().end())});
  }
  plan.workload_before = proto.workload_before();
  plan.workload_after = proto.workload_after();
  plan.attention_masks.reserve(proto.attention_masks_size());
  for (int i = 0; i < proto.attention_masks_size(); ++i) {
    absl::StatusOr<AttentionMask> mask =
        MaskFromProto(proto.attention_masks(i), absl::StrCat("plan.attention_masks[", i, "]"));
    if (!mask.ok()) return absl::InternalError(mask.status().message());
    plan.attention_masks.push_back(*std::move(mask));
  }
  return plan;
}

}  // namespace knapformer
