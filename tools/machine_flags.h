#ifndef KNAPFORMER_TOOLS_MACHINE_FLAGS_H_
#define KNAPFORMER_TOOLS_MACHINE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "planner/machine.h"

namespace knapformer {

// The flags that describe the machine (planner/machine.h), in the units
// people quote: --tflops, --intra-node-gbps, --inter-node-gbps (GB/s each
// way), --gpus-per-node, --element-bytes, --blocks-per-route.
const std::vector<std::string>& MachineFlagNames();

// The same flags for a usage text, with `defaults` as their defaults.
std::vector<OptionSpec> MachineFlagOptions(const Machine& defaults = Machine());

// `defaults` overridden by the flags given; InvalidArgument naming the flag
// and its range.
absl::StatusOr<Machine> ParseMachineFlags(const Args& args, const Machine& defaults = Machine());

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_MACHINE_FLAGS_H_
