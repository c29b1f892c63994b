#include "tools/machine_flags.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace knapformer {

const std::vector<std::string>& MachineFlagNames() {
  static const std::vector<std::string> kNames = {"tflops",        "intra-node-gbps",
                                                  "inter-node-gbps", "gpus-per-node",
                                                  "element-bytes", "blocks-per-route"};
  return kNames;
}

std::vector<OptionSpec> MachineFlagOptions(const Machine& defaults) {
  auto number = [](double value) { return absl::StrFormat("%g", value); };
  return {
      {"tflops", "X", number(defaults.flops_per_second / 1e12),
       "TFLOP/s one GPU computes"},
      {"intra-node-gbps", "X", number(defaults.intra_node_bytes_per_second / 1e9),
       "GB/s each way between GPUs of one node"},
      {"inter-node-gbps", "X", number(defaults.inter_node_bytes_per_second / 1e9),
       "GB/s each way between nodes"},
      {"gpus-per-node", "N", absl::StrCat(defaults.gpus_per_node), "GPUs in one node"},
      {"element-bytes", "B", absl::StrCat(defaults.element_bytes),
       "bytes of one activation element"},
      {"blocks-per-route", "N", absl::StrCat(defaults.blocks_per_route),
       "transformer blocks between a route and its reverse"},
  };
}

absl::StatusOr<Machine> ParseMachineFlags(const Args& args, const Machine& defaults) {
  Machine machine = defaults;
  struct Rate {
    const char* flag;
    double* value;
    double unit;
  };
  for (const Rate& rate : {Rate{"tflops", &machine.flops_per_second, 1e12},
                           Rate{"intra-node-gbps", &machine.intra_node_bytes_per_second, 1e9},
                           Rate{"inter-node-gbps", &machine.inter_node_bytes_per_second, 1e9}}) {
    auto value = args.GetDouble(rate.flag, *rate.value / rate.unit);
    if (!value.ok()) return value.status();
    if (!std::isfinite(*value) || *value <= 0 || *value > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", rate.flag, ": must be in (0, 1e6], got ", *value));
    }
    *rate.value = *value * rate.unit;
  }
  auto per_node = args.GetInt("gpus-per-node", machine.gpus_per_node, 1, 65536);
  if (!per_node.ok()) return per_node.status();
  machine.gpus_per_node = static_cast<int32_t>(*per_node);
  auto element = args.GetInt("element-bytes", machine.element_bytes, 1, 64);
  if (!element.ok()) return element.status();
  machine.element_bytes = static_cast<int32_t>(*element);
  auto blocks = args.GetInt("blocks-per-route", machine.blocks_per_route, 1, 1000000);
  if (!blocks.ok()) return blocks.status();
  machine.blocks_per_route = static_cast<int32_t>(*blocks);
  return machine;
}

}  // namespace knapformer
