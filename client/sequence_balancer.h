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
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "client/planner_client.h"
#include "client/sequence_balancer_options.h"
#include "transport/transport.h"

namespace knapformer {

// What one step may set beyond its lengths.
struct StepOverrides {
  // The cost model's d_model for this step (e.g. the hidden size of the
  // tensors about to be routed); 0 = SequenceBalancerOptions::d_model.
  int32_t d_model = 0;
  // Bytes per routed token for the service's moved-bytes figures; < 0 =
  // SequenceBalancerOptions::token_bytes, or when that is 0, what the
  // previous step's Route moved per token.
  int64_t token_bytes = -1;
  // An input the caller refused before it reached the balancer (a binding
  // that could not read this rank's attention masks): the rank still joins
  // PlanRouting, and every rank fails it with this error, naming this rank.
  absl::Status refused_input;
};

// Errors are agreed: every collective call either succeeds on every rank of
// its group (the world for PlanRouting, Route and ReverseRoute; the bag for
// PreAttn and PostAttn) or returns the same status on every one of them, the
// lowest failing world rank's ("rank 2: route: ..."), or one naming the
// ranks whose tensors differ, the field and both values, before any
// received row is trusted, so the next call works. The first exchange of
// each call in a step pays one small all-gather for this; later ones carry
// a status byte per rank with their rows (client/row_exchange.h,
// SequenceBalancerOptions::agree_on_errors). A peer that dies makes the
// survivors' call fail with the transport's Unavailable/DeadlineExceeded,
// and the transport stays broken.
//
// Backward exchanges run in the reverse of the forward order on every rank:
// each exchange's autograd node waits for the next one's (a chain of empty
// link tensors), whatever each rank's graph. Within one step, do not record
// two graphs and backpropagate them separately afterwards (forward A,
// forward B, backward A, backward B): B's first exchange is chained to A's
// last. Forward, backward, forward, backward is fine, and exchanges recorded
// during a backward pass (activation checkpointing) are not chained.
class SequenceBalancer {
 public:
  // Collective over `world` (every rank calls it): a rank of a multi-GPU bag
  // builds its bag's subgroup (under "auto", one per block size it may be
  // asked to use: no step creates a communicator). `world` must outlive the balancer and every
  // backward pass through tensors it produced (the bag's subgroup is kept
  // alive by those backward passes themselves).
  static absl::StatusOr<std::unique_ptr<SequenceBalancer>> Create(SequenceBalancerOptions options,
                                                                 Transport* world);
  // The same, sharing ownership of `world`: the balancer and every autograd
  // node it creates keep it alive, so a backward pass may run after the
  // balancer is destroyed (what a garbage-collected language needs).
  static absl::StatusOr<std::unique_ptr<SequenceBalancer>> Create(
      SequenceBalancerOptions options, std::shared_ptr<Transport> world);
  ~SequenceBalancer();

  // Collective: plans the next step. `lengths` are this rank's sequence
  // lengths in the order they are packed (zero-length sequences and no
  // sequences at all are fine). Errors are the same on every rank: every
  // rank learns of a refused input, a planner failure or an inconsistent
  // plan in the same collectives. `masks` (optional): the attention mask
  // of each sequence (planner/attention_mask.h), which the plan prices;
  // in a step where any rank gives them, every rank with sequences must,
  // else every rank gets InvalidArgument naming the first rank without.
  absl::Status PlanRouting(const std::vector<int64_t>& lengths,
                           const StepOverrides& overrides = {},
                           const std::vector<AttentionMask>& masks = {});

  // Plan ahead: starts planning the step after the current one (the next
  // PlanRouting's) with these lengths, so that its PlanRouting finds the
  // plan ready instead of waiting for the planner. Call it while the
  // current step computes, as soon as the data loader has the next batch,
  // on every rank (or on none) for a step. Only the planner's RPC runs in
  // the background; the collectives it needs run here, on the caller's
  // thread (PlannerClient::Prefetch). The next PlanRouting must then pass
  // the same lengths and overrides: otherwise it fails on every rank with
  // FailedPrecondition naming the rank and the step.
  absl::Status PrefetchRouting(const std::vector<int64_t>& lengths,
                               const StepOverrides& overrides = {},
                               const std::vector<AttentionMask>& masks = {});

  // This rank's measured compute time (forward + backward) of the current
  // step; sent with the next PlanRouting for the service's gamma fit.
  void RecordComputeSeconds(double seconds);

  // The step's plan and where it came from (service or local).
  const StepPlan& step_plan() const;
  uint64_t step() const;

  // Collective. [sum(lengths), ...] packed in this rank's order ->
  // [sum(routed_lengths()), ...]: the chunks this rank computes on, in
  // routed_lengths() order. Any dtype, any trailing shape, differentiable
  // (floating tensors that require grad get their gradients back exactly).
  // Every rank must pass the same dtypes and trailing shapes.
  absl::StatusOr<at::Tensor> Route(const at::Tensor& x) const;
  // Several per-token tensors (hidden states, positions, masks...) in one
  // exchange: each keeps its own dtype and shape, bit for bit.
  absl::StatusOr<std::vector<at::Tensor>> RouteTensors(const std::vector<at::Tensor>& xs) const;
  // Collective. The inverse of Route: back to [sum(lengths), ...].
  absl::StatusOr<at::Tensor> ReverseRoute(const at::Tensor& y) const;
  absl::StatusOr<std::vector<at::Tensor>> ReverseRouteTensors(
      const std::vector<at::Tensor>& ys) const;
  // Tokens of each chunk this rank computes on (a whole sequence in a
  // single-GPU bag, its share of one in a multi-GPU bag).
  const std::vector<int64_t>& routed_lengths() const;
  // This step's lengths as given to PlanRouting (ReverseRoute's output).
  const std::vector<int64_t>& input_lengths() const;

  // Collective within the bag (Ulysses). [sum(routed_lengths()), heads, ...]
  // -> [sum(attention_lengths()), heads / bag_gpus(), ...]: whole sequences,
  // a slice of the heads. Identity in a single-GPU bag. InvalidArgument on
  // every rank alike unless heads is a multiple of every bag size the
  // topology may use (heads_multiple()), so that no bag fails while others
  // go on.
  absl::StatusOr<at::Tensor> PreAttn(const at::Tensor& x) const;
  // q, k and v (same rows and heads; any dtypes and head dims) in one
  // exchange.
  absl::StatusOr<std::vector<at::Tensor>> PreAttnTensors(const std::vector<at::Tensor>& xs) const;
  // Collective within the bag: the inverse of PreAttn.
  absl::StatusOr<at::Tensor> PostAttn(const at::Tensor& y) const;
  absl::StatusOr<std::vector<at::Tensor>> PostAttnTensors(const std::vector<at::Tensor>& ys) const;
  // The tensor calls, for RefuseCall and BackwardOf.
  enum class Call { kRoute, kReverseRoute, kPreAttn, kPostAttn };
  // Collective, as the call's: the backward of call `which` of this step
  // for `grads`, the gradients of its outputs (shaped as they are), without
  // recording a graph: exactly the exchange the call's autograd node runs
  // (row_exchange.h's Reversed, flags only), with PreAttn's and PostAttn's
  // reshaping. What the torch.compile custom ops' backward calls, so that
  // eager and compiled training share one backward of each exchange.
  absl::StatusOr<std::vector<at::Tensor>> BackwardOf(Call which,
                                                     const std::vector<at::Tensor>& grads) const;
  // Collective, in place of call `which` on a rank that cannot make it (its
  // arguments were refused before they reached the balancer, e.g. by a
  // language binding): takes part in that call's agreement, so every rank
  // of the call's group (the world for routes, the bag for Ulysses) returns
  // the same error instead of waiting for this one. Returns that error
  // (`reason`, unless a lower rank failed too). REQUIRES: !reason.ok().
  absl::Status RefuseCall(Call which, const absl::Status& reason) const;

  // Full lengths of the sequences attention sees on this rank (for varlen
  // attention), in PreAttn's output order.
  const std::vector<int64_t>& attention_lengths() const;
  // In a step planned with masks, the mask of each of those sequences (in
  // the same order), to build the attention kernel's mask from; empty in a
  // step without masks.
  const std::vector<AttentionMask>& attention_masks() const;

  // This step's bag (it changes from step to step under "auto").
  int bag_gpus() const;
  int bag_first_rank() const;
  // The least common multiple of the bag sizes the topology may use (under
  // "auto", its largest bag): PreAttn needs heads to be a multiple of it.
  int heads_multiple() const;
  // Bytes per token the last RouteTensors moved (summed over its tensors);
  // 0 before the first.
  int64_t routed_token_bytes() const;
  // The spec of the current step (job, step, topology, cost model...).
  const v1::StepSpec& spec() const;

 private:
  struct Rep;
  explicit SequenceBalancer(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_SEQUENCE_BALANCER_H_
