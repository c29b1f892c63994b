#include "client/settings_agreement.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/settings_agreement.pb.h"
#include "common/rank_ranges.h"
#include "planner/cost_model.h"
#include "transport/agreement.h"
#include "transport/transport.h"

namespace knapformer {
namespace {

std::string Exact(double value) { return absl::StrFormat("%.17g", value); }

// The table's points exactly, "none" without one.
std::string MeasuredText(const std::optional<MeasuredAttention>& table) {
  if (!table.has_value()) return "none";
  std::vector<std::string> points;
  for (size_t i = 0; i < table->pairs().size(); ++i) {
    points.push_back(absl::StrCat(Exact(table->pairs()[i]), ":", Exact(table->work()[i])));
  }
  return absl::StrJoin(points, ",");
}

// "rank 3", "ranks 0-2", "ranks 0, 2, 5-7".
std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", RankRanges(ranks, ", "));
}

client::SharedSettingList ListOf(const SharedSettings& settings) {
  client::SharedSettingList list;
  for (const auto& [name, value] : settings) {
    client::SharedSetting* setting = list.add_settings();
    setting->set_name(name);
    setting->set_value(value);
  }
  return list;
}

// SettingsDisagreement of decoded lists.
std::string Disagreement(const std::vector<client::SharedSettingList>& all) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].settings_size() != all[0].settings_size()) {
      return absl::StrCat("rank ", r, " has ", all[r].settings_size(), " settings, rank 0 ",
                          all[0].settings_size(), " (another knapformer version?)");
    }
  }
  for (int field = 0; !all.empty() && field < all[0].settings_size(); ++field) {
    const std::string& field_name = all[0].settings(field).name();
    // Ranks by value, values in the order their first rank comes.
    std::map<std::string, std::vector<int>> ranks_of;
    std::vector<std::string> order;
    for (size_t r = 0; r < all.size(); ++r) {
      const client::SharedSetting& setting = all[r].settings(field);
      if (setting.name() != field_name) {
        return absl::StrCat("rank ", r, " has setting '", setting.name(), "' where rank 0 has '",
                            field_name, "' (another knapformer version?)");
      }
      if (ranks_of.find(setting.value()) == ranks_of.end()) order.push_back(setting.value());
      ranks_of[setting.value()].push_back(static_cast<int>(r));
    }
    if (order.size() == 1) continue;
    // The minority first: the ranks most likely misconfigured.
    std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
      return ranks_of[a].size() < ranks_of[b].size();
    });
    std::vector<std::string> parts;
    for (const std::string& value : order) {
      parts.push_back(
          absl::StrCat("'", absl::CHexEscape(value), "' on ", RankList(ranks_of[value])));
    }
    return absl::StrCat(field_name, " is ", absl::StrJoin(parts, " but "));
  }
  return "";
}

absl::Status Differ(const std::string& reason) {
  if (reason.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ranks' balancer settings differ: ", reason,
      "; every rank must create its SequenceBalancer with the same settings"));
}

// "learned", "one speed", or every declared speed exactly.
std::string RankSpeedsText(const PlannerClientOptions& planner) {
  if (planner.learn_rank_speeds) return "learned";
  if (planner.balancer.rank_speeds.empty()) return "one speed";
  std::string text;
  for (double s : planner.balancer.rank_speeds) absl::StrAppend(&text, text.empty() ? "" : ",", Exact(s));
  return text;
}

}  // namespace

SharedSettings SharedSettingsOf(const SequenceBalancerOptions& options) {
  const Machine& m = options.machine;
  return {
      {"topology", options.topology},
      {"d_model", absl::StrCat(options.d_model)},
      {"gamma", Exact(options.gamma)},
      {"cost_model", CostKindName(options.cost_model)},
      {"measured_attention", MeasuredText(options.measured_attention)},
      {"locality", options.locality.has_value() ? (*options.locality ? "on" : "off")
                                                : "the planner's"},
      {"max_tokens_per_gpu", absl::StrCat(options.max_tokens_per_gpu)},
      {"rank_speeds", RankSpeedsText(options.planner)},
      {"planner_address", options.planner.address},
      {"planner_mode", PlannerModeName(options.planner.mode)},
      {"require_planner", options.planner.require_service ? "true" : "false"},
      {"job_id", options.job_id},
      {"group_id", options.group_id},
      {"first_step", absl::StrCat(options.first_step)},
      {"use_fitted_gamma", options.use_fitted_gamma ? "true" : "false"},
      {"agree_on_errors", !options.agree_on_errors         ? "false"
                          : options.agree_every_exchange ? "every_exchange"
                                                         : "true"},
      {"machine.flops_per_second", Exact(m.flops_per_second)},
      {"machine.intra_node_bytes_per_second", Exact(m.intra_node_bytes_per_second)},
      {"machine.inter_node_bytes_per_second", Exact(m.inter_node_bytes_per_second)},
      {"machine.gpus_per_node", absl::StrCat(m.gpus_per_node)},
      {"machine.element_bytes", absl::StrCat(m.element_bytes)},
      {"machine.blocks_per_route", absl::StrCat(m.blocks_per_route)},
  };
}

std::string EncodeSettings(const SharedSettings& settings) {
  client::SettingsReport report;
  *report.mutable_verdict() = VerdictOf(absl::OkStatus());
  *report.mutable_settings() = ListOf(settings);
  return report.SerializeAsString();
}

std::string EncodeSettingsRefusal(const absl::Status& why) {
  client::SettingsReport report;
  *report.mutable_verdict() = VerdictOf(why.ok() ? absl::UnknownError("refused") : why);
  return report.SerializeAsString();
}

std::string SettingsDisagreement(const std::vector<std::string>& encoded) {
  std::vector<client::SharedSettingList> all(encoded.size());
  for (size_t r = 0; r < encoded.size(); ++r) {
    client::SettingsReport report;
    if (!report.ParseFromString(encoded[r])) {
      return absl::StrCat("rank ", r, " sent settings that do not decode");
    }
    all[r] = std::move(*report.mutable_settings());
  }
  return Disagreement(all);
}

absl::Status CheckSettingsAgree(const std::vector<std::string>& encoded) {
  for (size_t r = 0; r < encoded.size(); ++r) {
    client::SettingsReport report;
    if (!report.ParseFromString(encoded[r])) continue;  // SettingsDisagreement names it
    const int rank = static_cast<int>(r);
    if (absl::Status valid = CheckVerdict(report.verdict(), rank); !valid.ok()) return valid;
    const absl::Status refused = StatusOf(report.verdict(), rank);
    if (!refused.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " refused its arguments (",
                                                     refused.message(),
                                                     "); every rank fails with it"));
    }
  }
  return Differ(SettingsDisagreement(encoded));
}

absl::Status AgreeOnSettings(Transport& world, const SharedSettings& mine) {
  // The reports, judged by CheckSettingsAgree: the Python binding's path
  // (its all-gather is torch.distributed's), so both name the same fault.
  absl::StatusOr<std::vector<std::string>> all = world.AllGatherBytes(EncodeSettings(mine));
  if (!all.ok()) return all.status();
  return CheckSettingsAgree(*all);
}

}  // namespace knapformer
