#ifndef KNAPFORMER_CLIENT_SEQUENCE_BALANCER_H_
#define KNAPFORMER_CLIENT_SEQUENCE_BALANCER_H_

// KnapFormer's SequenceBalancer on LibTorch tensors: each step, plan the
// routing of this rank's packed sequences, route them to their compute bags,
// exchange heads for Ulysses attention inside multi-GPU bags, and route the
// results back. Every data movement is differentiable: its backward is the
// reverse exchange, so gradients arrive exactly where their tokens came from.
//
// Includes only ATen's Tensor class; the autograd machinery stays in the .cc.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "client/planner_client.h"
#include "planner/cost_model.h"
#include "transport/transport.h"

namespace knapformer {

struct SequenceBalancerOptions {
  // The service's rendezvous key (one balancer per job and group).
  std::string job_id = "default";
  std::string group_id;
  // Compute bags of one replica, e.g. "g1n2+g2n1+g4n1"; the world is
  // transport size / GPUs of the topology replicas of it.
  std::string topology;
  // The cost model: transformer 24*l*d^2 + gamma*4*l^2*d (d_model and gamma
  // are checked whatever the kind), uniform or linear (planner/cost_model.h).
  CostKind cost_model = CostKind::kTransformer;
  int32_t d_model = 0;
  double gamma = 1.0;
  // Bytes per token of the routed tensors, for the service's moved-bytes
  // figures only; 0 = unknown.
  int64_t token_bytes = 0;
  // Memory: at most this many tokens on any GPU after routing; 0 = no cap.
  // PlanRouting fails (ResourceExhausted, on every rank) when no placement
  // meets it.
  int64_t max_tokens_per_gpu = 0;
  // The first PlanRouting is this step; each call takes the next one. All
  // ranks must start at the same step (e.g. the trainer's step on resume).
  uint64_t first_step = 0;
  // Plan with the gamma the planner service fits to this job's step timings
  // (RecordComputeSeconds) once it has one; `gamma` until then.
  bool use_fitted_gamma = false;
  PlannerClientOptions planner;
};

class SequenceBalancer {
 public:
  // Collective over `world` (every rank calls it): a rank of a multi-GPU bag
  // builds its bag's subgroup. `world` must outlive the balancer and every
  // backward pass through tensors it produced.
  static absl::StatusOr<std::unique_ptr<SequenceBalancer>> Create(SequenceBalancerOptions options,
                                                                 Transport* world);
  ~SequenceBalancer();

  // Collective: plans the next step. `lengths` are this rank's sequence
  // lengths in the order they are packed (zero-length sequences and no
  // sequences at all are fine).
  absl::Status PlanRouting(const std::vector<int64_t>& lengths);

  // This rank's measured compute time (forward + backward) of the current
  // step; sent with the next PlanRouting for the service's gamma fit.
  void RecordComputeSeconds(double seconds);

  // The step's plan and where it came from (service or local).
  const StepPlan& step_plan() const;
  uint64_t step() const;

  // Collective. [sum(lengths), ...] packed in this rank's order ->
  // [sum(routed_lengths()), ...]: the chunks this rank computes on, in
  // routed_lengths() order. Any dtype, any trailing shape; call it once per
  // per-token tensor (hidden states, positions, masks...).
  absl::StatusOr<at::Tensor> Route(const at::Tensor& x) const;
  // Collective. The inverse of Route: back to [sum(lengths), ...].
  absl::StatusOr<at::Tensor> ReverseRoute(const at::Tensor& y) const;
  // Tokens of each chunk this rank computes on (a whole sequence in a
  // single-GPU bag, its share of one in a multi-GPU bag).
  const std::vector<int64_t>& routed_lengths() const;

  // Collective within the bag (Ulysses). [sum(routed_lengths()), heads, ...]
  // -> [sum(attention_lengths()), heads / bag_gpus(), ...]: whole sequences,
  // a slice of the heads. InvalidArgument unless heads % bag_gpus() == 0.
  // Identity in a single-GPU bag.
  absl::StatusOr<at::Tensor> PreAttn(const at::Tensor& x) const;
  // Collective within the bag: the inverse of PreAttn.
  absl::StatusOr<at::Tensor> PostAttn(const at::Tensor& y) const;
  // Full lengths of the sequences attention sees on this rank (for varlen
  // attention), in PreAttn's output order.
  const std::vector<int64_t>& attention_lengths() const;

  int bag_gpus() const;

 private:
  struct Rep;
  explicit SequenceBalancer(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_SEQUENCE_BALANCER_H_
