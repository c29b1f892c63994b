#include "client/settings_agreement.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner/cost_model.h"

namespace knapformer {
namespace {

std::string Exact(double value) { return absl::StrFormat("%.17g", value); }

// "rank 3", "ranks 0-2", "ranks 0, 2, 5-7".
std::string RankList(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(runs, ", "));
}

bool Decode(const std::string& encoded, SharedSettings* settings) {
  if (encoded.empty()) return true;
  for (absl::string_view line : absl::StrSplit(encoded, '\n')) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits('=', 1));
    std::string value;
    if (parts.size() != 2 || !absl::CUnescape(parts[1], &value)) return false;
    settings->emplace_back(parts[0], value);
  }
  return true;
}

}  // namespace

SharedSettings SharedSettingsOf(const SequenceBalancerOptions& options) {
  const Machine& m = options.machine;
  return {
      {"topology", options.topology},
      {"d_model", absl::StrCat(options.d_model)},
      {"gamma", Exact(options.gamma)},
      {"cost_model", CostKindName(options.cost_model)},
      {"locality", options.locality.has_value() ? (*options.locality ? "on" : "off")
                                                : "the planner's"},
      {"max_tokens_per_gpu", absl::StrCat(options.max_tokens_per_gpu)},
      {"planner_address", options.planner.address},
      {"planner_mode", PlannerModeName(options.planner.mode)},
      {"require_planner", options.planner.require_service ? "true" : "false"},
      {"job_id", options.job_id},
      {"group_id", options.group_id},
      {"first_step", absl::StrCat(options.first_step)},
      {"use_fitted_gamma", options.use_fitted_gamma ? "true" : "false"},
      {"agree_on_errors", options.agree_on_errors ? "true" : "false"},
      {"machine.flops_per_second", Exact(m.flops_per_second)},
      {"machine.intra_node_bytes_per_second", Exact(m.intra_node_bytes_per_second)},
      {"machine.inter_node_bytes_per_second", Exact(m.inter_node_bytes_per_second)},
      {"machine.gpus_per_node", absl::StrCat(m.gpus_per_node)},
      {"machine.element_bytes", absl::StrCat(m.element_bytes)},
      {"machine.blocks_per_route", absl::StrCat(m.blocks_per_route)},
  };
}

std::string EncodeSettings(const SharedSettings& settings) {
  std::vector<std::string> lines;
  for (const auto& [name, value] : settings) {
    lines.push_back(absl::StrCat(name, "=", absl::CEscape(value)));
  }
  return absl::StrJoin(lines, "\n");
}

std::string SettingsDisagreement(const std::vector<std::string>& encoded) {
  std::vector<SharedSettings> all(encoded.size());
  for (size_t r = 0; r < encoded.size(); ++r) {
    if (!Decode(encoded[r], &all[r])) {
      return absl::StrCat("rank ", r, " sent settings that do not decode");
    }
    if (all[r].size() != all[0].size()) {
      return absl::StrCat("rank ", r, " has ", all[r].size(), " settings, rank 0 ",
                          all[0].size(), " (another knapformer version?)");
    }
  }
  for (size_t field = 0; !all.empty() && field < all[0].size(); ++field) {
    // Ranks by value, values in the order their first rank comes.
    std::map<std::string, std::vector<int>> ranks_of;
    std::vector<std::string> order;
    for (size_t r = 0; r < all.size(); ++r) {
      const auto& [name, value] = all[r][field];
      if (name != all[0][field].first) {
        return absl::StrCat("rank ", r, " has setting '", name, "' where rank 0 has '",
                            all[0][field].first, "' (another knapformer version?)");
      }
      if (ranks_of.find(value) == ranks_of.end()) order.push_back(value);
      ranks_of[value].push_back(static_cast<int>(r));
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
    return absl::StrCat(all[0][field].first, " is ", absl::StrJoin(parts, " but "));
  }
  return "";
}

absl::Status AgreeOnSettings(Transport& world, const SharedSettings& mine) {
  absl::StatusOr<std::vector<std::string>> all = world.AllGatherBytes(EncodeSettings(mine));
  if (!all.ok()) return all.status();
  return CheckSettingsAgree(*all);
}

absl::Status CheckSettingsAgree(const std::vector<std::string>& encoded) {
  const std::string reason = SettingsDisagreement(encoded);
  if (reason.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ranks' balancer settings differ: ", reason,
      "; every rank must create its SequenceBalancer with the same settings"));
}

}  // namespace knapformer
