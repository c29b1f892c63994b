#include "planner/machine.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace knapformer {

MachineField FieldOfMachine(Machine& machine, const std::string& name) {
  if (name == "flops_per_second") return {&machine.flops_per_second, nullptr};
  if (name == "intra_node_bytes_per_second") return {&machine.intra_node_bytes_per_second, nullptr};
  if (name == "inter_node_bytes_per_second") return {&machine.inter_node_bytes_per_second, nullptr};
  if (name == "gpus_per_node") return {nullptr, &machine.gpus_per_node};
  if (name == "element_bytes") return {nullptr, &machine.element_bytes};
  if (name == "blocks_per_route") return {nullptr, &machine.blocks_per_route};
  return {};
}

absl::Status CheckMachine(const Machine& machine, const std::string& field) {
  struct Member {
    const char* name;
    double value, lo, hi;
  };
  for (const Member& m : {Member{"flops_per_second", machine.flops_per_second, 1, 1e20},
                          Member{"intra_node_bytes_per_second",
                                 machine.intra_node_bytes_per_second, 1, 1e20},
                          Member{"inter_node_bytes_per_second",
                                 machine.inter_node_bytes_per_second, 1, 1e20},
                          Member{"gpus_per_node", static_cast<double>(machine.gpus_per_node), 1,
                                 65536},
                          Member{"element_bytes", static_cast<double>(machine.element_bytes), 1,
                                 64},
                          Member{"blocks_per_route",
                                 static_cast<double>(machine.blocks_per_route), 1, 1e6}}) {
    if (!std::isfinite(m.value) || m.value < m.lo || m.value > m.hi) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".", m.name, ": ", m.value,
                                                     " is outside [", m.lo, ", ", m.hi, "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CommPrices> CommPrices::Create(const Machine& machine, const CostModel& cost,
                                              int64_t route_token_bytes) {
  if (absl::Status s = CheckMachine(machine); !s.ok()) return s;
  if (!PricedInFlops(cost.kind())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cost_model: communication is priced for the transformer and measured models, not ",
        CostKindName(cost.kind())));
  }
  if (route_token_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_bytes: must be >= 0, got ", route_token_bytes));
  }
  const double d = static_cast<double>(cost.d_model());
  const double route_bytes = route_token_bytes > 0 ? static_cast<double>(route_token_bytes)
                                                   : d * machine.element_bytes;
  // Seconds of a link turned into the FLOPs the GPU could have done.
  const double intra = machine.flops_per_second / machine.intra_node_bytes_per_second;
  const double inter = machine.flops_per_second / machine.inter_node_bytes_per_second;
  CommPrices prices;
  prices.machine_ = machine;
  const double ulysses_bytes = 4 * d * machine.element_bytes;
  prices.ulysses_intra_ = ulysses_bytes * intra;
  prices.ulysses_inter_ = ulysses_bytes * inter;
  // Forward route and reverse route, spread over the blocks between them.
  prices.route_intra_ = 2 * route_bytes * intra / machine.blocks_per_route;
  prices.route_inter_ = 2 * route_bytes * inter / machine.blocks_per_route;
  return prices;
}

double CommPrices::UlyssesPerToken(int32_t gpus, bool crosses_nodes) const {
  if (gpus <= 1) return 0;
  const double leaving = static_cast<double>(gpus - 1) / gpus;
  return leaving * (crosses_nodes ? ulysses_inter_ : ulysses_intra_);
}

}  // namespace knapformer
