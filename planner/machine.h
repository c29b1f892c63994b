#ifndef KNAPFORMER_PLANNER_MACHINE_H_
#define KNAPFORMER_PLANNER_MACHINE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/cost_model.h"

namespace knapformer {

// What the GPUs and their links can do: enough to price communication in the
// cost model's units. The transformer cost model's workload,
// 24*l*d^2 + gamma*4*l^2*d, is the FLOPs of one block's forward pass on l
// tokens (attention scaled by gamma), so one second of a GPU is worth
// `flops_per_second` units.
//
// Defaults: one NVIDIA H100 SXM5 in an 8-GPU node (DGX/HGX H100), from the
// vendor's figures (copied in docs/planner.md, "Communication"): 989.4 TFLOP/s
// dense BF16, NVLink 4 at 900 GB/s per GPU both directions together (450 GB/s
// each way), one 400 Gb/s InfiniBand port per GPU (50 GB/s each way). These
// are peaks: `knapformer calibrate --exchanges` fits the achieved ones.
struct Machine {
  double flops_per_second = 989.4e12;
  // Bytes per second one GPU sends (and, at the same time, receives) over
  // NVLink to GPUs of its node, and over the network to other nodes.
  double intra_node_bytes_per_second = 450e9;
  double inter_node_bytes_per_second = 50e9;
  // Global ranks are node-major: rank r is on node r / gpus_per_node.
  int32_t gpus_per_node = 8;
  // Bytes of one activation element (2: bf16).
  int32_t element_bytes = 2;
  // Transformer blocks computed between a route and its reverse: the route's
  // bytes are paid once for all of them, so one block carries 1/this of it.
  int32_t blocks_per_route = 28;
};

// A Machine member by its name (as spelled in the struct), for the APIs
// that take a machine as named fields (plan's JSON, Python's machine=):
// `rate` for the three rates, `count` for the three integers, both null for
// a name that is no member.
struct MachineField {
  double* rate = nullptr;
  int32_t* count = nullptr;
};
MachineField FieldOfMachine(Machine& machine, const std::string& name);
// The member names, comma-separated, for "unknown field" messages.
inline constexpr char kMachineFieldNames[] =
    "flops_per_second, intra_node_bytes_per_second, inter_node_bytes_per_second, "
    "gpus_per_node, element_bytes, blocks_per_route";

// InvalidArgument naming `field`.<member> unless the rates are finite and in
// [1, 1e20], gpus_per_node in [1, 65536], element_bytes in [1, 64] and
// blocks_per_route in [1, 1e6].
absl::Status CheckMachine(const Machine& machine, const std::string& field = "machine");

// What moving tokens costs, per token, in the cost model's units (the FLOPs
// the GPU could have done in that time). Requires the transformer model: its
// d_model is the width of what Ulysses exchanges.
class CommPrices {
 public:
  // `route_token_bytes`: bytes of one token in the route's all-to-all; 0 =
  // d_model * element_bytes (the hidden states alone). InvalidArgument on a
  // bad machine, a cost model other than the transformer, or negative bytes.
  static absl::StatusOr<CommPrices> Create(const Machine& machine, const CostModel& cost,
                                           int64_t route_token_bytes = 0);

  const Machine& machine() const { return machine_; }

  // Ulysses in a bag of `gpus` GPUs: per layer, four all-to-alls (q, k, v
  // before attention, its output after), each of d_model elements per token,
  // of which (G-1)/G leave the GPU. Per token the GPU holds; 0 for one GPU.
  double UlyssesPerToken(int32_t gpus, bool crosses_nodes) const;
  // The route and its reverse, per token a GPU sends or receives (the larger
  // of the two counts: links are full duplex), per block.
  double RoutePerToken(bool inter_node) const {
    return inter_node ? route_inter_ : route_intra_;
  }
  int32_t NodeOf(int32_t rank) const { return rank / machine_.gpus_per_node; }
  // Whether ranks [first, first + gpus) span more than one node.
  bool CrossesNodes(int32_t first, int32_t gpus) const {
    return NodeOf(first) != NodeOf(first + gpus - 1);
  }

 private:
  CommPrices() = default;

  Machine machine_;
  double ulysses_intra_ = 0;  // per token for G -> infinity: (G-1)/G scales it
  double ulysses_inter_ = 0;
  double route_intra_ = 0;
  double route_inter_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_MACHINE_H_
