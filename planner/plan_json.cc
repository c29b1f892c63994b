#include "planner/plan_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/auto_layout.h"
#include "planner/balance_stats.h"
#include "planner/cost_model.h"
#include "planner/mask_json.h"
#include "planner/rank_speeds.h"
#include "common/status_macros.h"
#include "planner/topology.h"
#include "planner/validate.h"

namespace knapformer {
namespace {

using nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// JSON has no infinity: an unbounded ratio (some GPU idle) is written as null.
json Ratio(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

json StatsJson(const BalanceStats& stats) {
  return json{{"max", stats.max},
              {"min", stats.min},
              {"mean", stats.mean},
              {"wir", Ratio(stats.wir)},
              {"max_over_mean", Ratio(stats.max_over_mean)}};
}

// {"pairs": [...], "work": [...]}: a measured attention table.
absl::StatusOr<MeasuredAttention> ParseMeasuredAttention(const json& table,
                                                         const std::string& field) {
  if (!table.is_object()) {
    return FieldError(field, "must be an object {\"pairs\": [...], \"work\": [...]}");
  }
  std::vector<double> columns[2];
  const char* names[2] = {"pairs", "work"};
  for (const auto& item : table.items()) {
    if (item.key() != names[0] && item.key() != names[1]) {
      return FieldError(absl::StrCat(field, ".", item.key()),
                        "unknown field (expected pairs, work)");
    }
  }
  for (int c = 0; c < 2; ++c) {
    const std::string column = absl::StrCat(field, ".", names[c]);
    if (!table.contains(names[c])) return FieldError(column, "missing");
    const json& values = table[names[c]];
    if (!values.is_array()) return FieldError(column, "must be an array of numbers");
    if (values.size() > static_cast<size_t>(MeasuredAttention::kMaxPoints)) {
      return FieldError(column, absl::StrCat(values.size(), " points, over the limit of ",
                                             MeasuredAttention::kMaxPoints));
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (!values[i].is_number()) {
        return FieldError(absl::StrCat(column, "[", i, "]"), "must be a number");
      }
      columns[c].push_back(values[i].get<double>());
    }
  }
  return MeasuredAttention::Create(std::move(columns[0]), std::move(columns[1]), field);
}

json MeasuredAttentionJson(const MeasuredAttention& table) {
  return json{{"pairs", table.pairs()}, {"work", table.work()}};
}

// "machine": an object of planner/machine.h's fields by name.
absl::Status ParseMachine(const json& fields, Machine* machine) {
  if (!fields.is_object()) return FieldError("machine", "must be an object of machine fields");
  for (const auto& item : fields.items()) {
    const std::string field = absl::StrCat("machine.", item.key());
    const MachineField member = FieldOfMachine(*machine, item.key());
    const json& value = item.value();
    if (member.rate != nullptr) {
      if (!value.is_number()) return FieldError(field, "must be a number");
      *member.rate = value.get<double>();
    } else if (member.count != nullptr) {
      if (!value.is_number_integer()) return FieldError(field, "must be an integer");
      const bool fits = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                            : value.get<int64_t>() >= INT32_MIN && value.get<int64_t>() <= INT32_MAX;
      if (!fits) return FieldError(field, absl::StrCat(value.dump(), " is not a 32-bit integer"));
      *member.count = static_cast<int32_t>(value.get<int64_t>());
    } else {
      return FieldError(field, absl::StrCat("unknown field (expected ", kMachineFieldNames, ")"));
    }
  }
  return CheckMachine(*machine, "machine");
}

}  // namespace

absl::StatusOr<PlanRequest> ParsePlanRequest(absl::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("input: not valid JSON (byte ", error.byte, ")"));
  } catch (const json::out_of_range&) {
    // A number past a double (1E400): thrown by the parser, not a parse_error.
    return absl::InvalidArgumentError("input: a number is out of range");
  }
  if (!root.is_object()) return FieldError("input", "must be a JSON object");
  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    if (key != "topology" && key != "d_model" && key != "gamma" && key != "token_bytes" &&
        key != "machine" && key != "ranks" && key != "masks" && key != "measured_attention" &&
        key != "rank_speeds") {
      return FieldError(key,
                        "unknown field (expected topology, d_model, gamma, token_bytes, machine, "
                        "ranks, masks, measured_attention, rank_speeds)");
    }
  }
  PlanRequest request;

  if (!root.contains("topology")) return FieldError("topology", "missing");
  if (!root["topology"].is_string()) return FieldError("topology", "must be a string");
  request.topology = root["topology"].get<std::string>();

  if (root.contains("d_model")) {
    const json& d = root["d_model"];
    if (!d.is_number_integer()) return FieldError("d_model", "must be an integer");
    if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(CostModel::kMaxDModel)) {
      return FieldError("d_model", absl::StrCat("must be in [1, ", CostModel::kMaxDModel, "]"));
    }
    request.d_model = d.get<int64_t>();
  }
  if (root.contains("gamma")) {
    if (!root["gamma"].is_number()) return FieldError("gamma", "must be a number");
    request.gamma = root["gamma"].get<double>();
  }
  request.token_bytes = 2 * request.d_model;
  if (root.contains("token_bytes")) {
    const json& bytes = root["token_bytes"];
    const std::string range = absl::StrCat("must be in [0, ", PlanRequest::kMaxTokenBytes, "]");
    if (!bytes.is_number_integer()) return FieldError("token_bytes", "must be an integer");
    if (bytes.is_number_unsigned()
            ? bytes.get<uint64_t>() > static_cast<uint64_t>(PlanRequest::kMaxTokenBytes)
            : bytes.get<int64_t>() < 0) {
      return FieldError("token_bytes", range);
    }
    request.token_bytes = bytes.get<int64_t>();
  }

  if (root.contains("machine")) KF_RETURN_IF_ERROR(ParseMachine(root["machine"], &request.machine));
  if (root.contains("measured_attention")) {
    KF_ASSIGN_OR_RETURN(request.measured_attention,
                        ParseMeasuredAttention(root["measured_attention"], "measured_attention"));
  }

  if (!root.contains("ranks")) return FieldError("ranks", "missing");
  const json& ranks = root["ranks"];
  if (!ranks.is_array()) return FieldError("ranks", "must be an array of arrays of lengths");
  if (ranks.empty()) return FieldError("ranks", "must list at least one rank");
  request.ranks.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const json& rank = ranks[r];
    const std::string rank_field = absl::StrCat("ranks[", r, "]");
    if (!rank.is_array()) return FieldError(rank_field, "must be an array of lengths");
    request.ranks[r].reserve(rank.size());
    for (size_t i = 0; i < rank.size(); ++i) {
      const json& length = rank[i];
      const std::string field = absl::StrCat(rank_field, "[", i, "]");
      if (!length.is_number_integer()) {
        return FieldError(field, "must be an integer number of tokens");
      }
      if (length.is_number_unsigned()
              ? length.get<uint64_t>() > static_cast<uint64_t>(CostModel::kMaxLength)
              : length.get<int64_t>() < 0) {
        return FieldError(field, absl::StrCat("sequence length ", length.dump(),
                                              " is outside [0, ", CostModel::kMaxLength, "]"));
      }
      request.ranks[r].push_back(length.get<int64_t>());
    }
  }
  if (root.contains("masks")) {
    KF_ASSIGN_OR_RETURN(request.masks, RankMasksFromJson(root["masks"], "masks"));
    // Given, it has a list per rank: "masks": [] is no way to say "none".
    if (request.masks.size() != request.ranks.size()) {
      return FieldError("masks", absl::StrCat("got masks for ", request.masks.size(),
                                              " ranks, there are ", request.ranks.size()));
    }
    KF_RETURN_IF_ERROR(CheckRankMasks(request.ranks, request.masks));
  }
  if (root.contains("rank_speeds")) {
    const json& speeds = root["rank_speeds"];
    if (!speeds.is_array()) return FieldError("rank_speeds", "must be an array of numbers");
    for (size_t r = 0; r < speeds.size(); ++r) {
      if (!speeds[r].is_number()) {
        return FieldError(absl::StrCat("rank_speeds[", r, "]"), "must be a number");
      }
      request.rank_speeds.push_back(speeds[r].get<double>());
    }
    KF_RETURN_IF_ERROR(
        CheckRankSpeeds(request.rank_speeds, static_cast<int64_t>(request.ranks.size())));
  }
  return request;
}

std::string CostTableToJson(const CostTable& table) {
  json out;
  out["cost_model"] = "measured";
  out["d_model"] = table.d_model;
  out["k"] = table.k;
  out["gamma"] = table.gamma;
  out["measured_attention"] = MeasuredAttentionJson(table.attention);
  return out.dump() + "\n";
}

absl::StatusOr<CostTable> ParseCostTable(absl::string_view json_text, absl::string_view source) {
  const auto error = [&](const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", status.message()));
  };
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception&) {
    return error(FieldError("input", "not valid JSON"));
  }
  if (!root.is_object()) return error(FieldError("input", "must be a JSON object"));
  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    if (key != "cost_model" && key != "d_model" && key != "k" && key != "gamma" &&
        key != "measured_attention") {
      return error(FieldError(
          key, "unknown field (expected cost_model, d_model, k, gamma, measured_attention)"));
    }
  }
  if (!root.contains("cost_model") || root["cost_model"] != "measured") {
    return error(
        FieldError("cost_model", "must be \"measured\" (a table calibrate --table wrote)"));
  }
  const json* d = root.contains("d_model") ? &root["d_model"] : nullptr;
  if (d == nullptr || !d->is_number_integer() ||
      d->get<int64_t>() < 1 ||
      (d->is_number_unsigned() && d->get<uint64_t>() > static_cast<uint64_t>(CostModel::kMaxDModel))) {
    return error(FieldError(
        "d_model", absl::StrCat("must be an integer in [1, ", CostModel::kMaxDModel, "]")));
  }
  for (const char* name : {"k", "gamma"}) {
    if (root.contains(name) && !root[name].is_number()) {
      return error(FieldError(name, "must be a number"));
    }
  }
  if (!root.contains("measured_attention")) {
    return error(FieldError("measured_attention", "missing"));
  }
  absl::StatusOr<MeasuredAttention> attention =
      ParseMeasuredAttention(root["measured_attention"], "measured_attention");
  if (!attention.ok()) return error(attention.status());
  return CostTable{d->get<int64_t>(), root.value("k", 0.0), root.value("gamma", 0.0),
                   *std::move(attention)};
}

std::string PlanToJson(const PlanRequest& request, const Plan& plan, double lower_bound,
                       const PredictedStep* predicted) {
  json chunks = json::array();
  for (const Chunk& chunk : plan.chunks) {
    chunks.push_back(json{{"src_rank", chunk.src_rank},
                          {"seq_index", chunk.seq_index},
                          {"offset", chunk.offset},
                          {"length", chunk.length},
                          {"dst_rank", chunk.dst_rank}});
  }
  json out;
  out["topology"] = plan.topology;
  out["world_size"] = plan.world_size;
  out["d_model"] = request.d_model;
  out["gamma"] = request.gamma;
  out["chunks"] = std::move(chunks);
  out["gpu_workload"] = plan.workload_after;
  out["gpu_workload_before"] = plan.workload_before;
  out["total_tokens"] = plan.TotalTokens();
  out["moved_tokens"] = plan.MovedTokens();
  out["token_bytes"] = request.token_bytes;
  out["moved_bytes"] = plan.MovedBytes(request.token_bytes);
  // By time on speeds, against the ideal.
  const PlanBalance balance = BalanceOf(plan, request.rank_speeds);
  out["before"] = StatsJson(balance.before);
  out["after"] = StatsJson(balance.after);
  if (const std::vector<double> speeds = NormalizedRankSpeeds(request.rank_speeds);
      !speeds.empty()) {
    out["rank_speeds"] = speeds;
  }
  out["lower_bound_max_over_mean"] = lower_bound;
  if (predicted != nullptr) {
    const double flops = request.machine.flops_per_second;
    out["predicted_step"] = json{{"seconds", predicted->time / flops},
                                 {"compute_seconds", predicted->compute / flops},
                                 {"ulysses_seconds", predicted->ulysses / flops},
                                 {"route_seconds", predicted->route / flops},
                                 {"slowest_rank", predicted->slowest_rank}};
  }
  return out.dump() + "\n";
}

std::string RankPlanToJson(const RankPlan& slice) {
  auto transfers = [](const std::vector<Transfer>& list, const char* peer) {
    json out = json::array();
    for (const Transfer& t : list) {
      out.push_back(json{{peer, t.peer},
                         {"seq_index", t.seq_index},
                         {"offset", t.offset},
                         {"length", t.length}});
    }
    return out;
  };
  json sequences = json::array();
  for (const UlyssesSequence& seq : slice.ulysses.sequences) {
    sequences.push_back(json{{"src_rank", seq.src_rank},
                             {"seq_index", seq.seq_index},
                             {"length", seq.length},
                             {"chunk_lengths", seq.chunk_lengths}});
  }
  json out;
  out["rank"] = slice.rank;
  out["world_size"] = slice.world_size;
  out["sends"] = transfers(slice.route.sends, "dst_rank");
  out["recvs"] = transfers(slice.route.recvs, "src_rank");
  out["compute_chunk_lengths"] = slice.compute_chunk_lengths;
  out["ulysses"] = json{{"first_rank", slice.ulysses.first_rank},
                        {"gpus", slice.ulysses.gpus},
                        {"position", slice.ulysses.position},
                        {"sequences", std::move(sequences)}};
  out["workload_before"] = slice.workload_before;
  out["workload_after"] = slice.workload_after;
  if (!slice.attention_masks.empty()) {
    json masks = json::array();
    for (const AttentionMask& mask : slice.attention_masks) {
      masks.push_back(json::parse(MaskToJson(mask)));
    }
    out["attention_masks"] = std::move(masks);
  }
  return out.dump() + "\n";
}

absl::StatusOr<std::string> PlanRequestToJson(absl::string_view request_json, CostKind cost_kind,
                                              const BalancerOptions& options,
                                              std::optional<int64_t> rank) {
  KF_ASSIGN_OR_RETURN(PlanRequest request, ParsePlanRequest(request_json));
  const int64_t ranks = static_cast<int64_t>(request.ranks.size());  // the world size
  // Under auto the world is the layout chosen for these lengths, on the
  // request's machine; "topology" in the answer names it.
  std::optional<AutoLayout> layout;
  std::optional<World> world;
  if (AutoLayout::Matches(request.topology)) {
    KF_ASSIGN_OR_RETURN(layout, AutoLayout::Parse(request.topology));
  } else {
    KF_ASSIGN_OR_RETURN(Topology topology, Topology::Parse(request.topology));
    if (ranks % topology.group_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: ", ranks, " ranks is not a multiple of the group size ", topology.group_size(),
          " of topology ", topology.spec()));
    }
    KF_ASSIGN_OR_RETURN(world, World::Create(std::move(topology), ranks));
  }
  if (rank.has_value() && (*rank < 0 || *rank >= ranks)) {
    return absl::InvalidArgumentError(absl::StrCat("rank: '", *rank,
                                                   "' is not a whole number in [0, ",
                                                   ranks - 1, "]"));
  }
  KF_ASSIGN_OR_RETURN(CostModel cost,
                      CostModel::Create(request.d_model, request.gamma, cost_kind,
                                        request.measured_attention.has_value()
                                            ? &*request.measured_attention
                                            : nullptr));
  // Communication is priced for the FLOP models: the answer's predicted_step
  // is made with it, and auto needs it (CommPrices refuses another model).
  std::optional<CommPrices> prices;
  if (layout.has_value() || PricedInFlops(cost.kind())) {
    KF_ASSIGN_OR_RETURN(prices, CommPrices::Create(request.machine, cost, request.token_bytes));
  }
  BalancerOptions by_speed = options;
  by_speed.rank_speeds = request.rank_speeds;
  Plan plan;
  if (layout.has_value()) {
    KF_ASSIGN_OR_RETURN(AutoPlan chosen,
                        BalanceAuto(*layout, ranks, cost, *prices, request.ranks, by_speed,
                                    &request.masks));
    plan = std::move(chosen.plan);
    world = std::move(chosen.world);
  } else {
    KF_ASSIGN_OR_RETURN(plan,
                        BalanceGreedy(*world, cost, request.ranks, by_speed, &request.masks));
  }
  KF_RETURN_IF_ERROR(ValidatePlan(plan, *world, request.ranks));
  if (rank.has_value()) return RankPlanToJson(plan.Slice(static_cast<int32_t>(*rank)));
  std::optional<PredictedStep> predicted;
  if (prices.has_value()) {
    predicted = PredictStep(plan, *world, request.ranks, cost, *prices, &request.masks,
                            NormalizedRankSpeeds(request.rank_speeds));
  }
  return PlanToJson(request, plan,
                    MaxOverMeanLowerBound(*world, cost, request.ranks, &request.masks,
                                          request.rank_speeds),
                    predicted.has_value() ? &*predicted : nullptr);
}

}  // namespace knapformer
