#ifndef KNAPFORMER_CLIENT_PLANNER_CLIENT_H_
#define KNAPFORMER_CLIENT_PLANNER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/planner_client_options.h"
#include "client/step_plan.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "transport/transport.h"

namespace knapformer {

// Gets each step's plan for one rank: from the planner service when one is
// configured and answers, else by all-gathering every rank's lengths over
// the transport and solving locally with the planner core (every rank then
// computes the identical plan). The ranks always agree on the source: after
// asking the service, they all-gather their outcomes (rank_report.h), and if
// any rank did not get its plan, all of them plan locally. The source is logged when it
// changes. After a step the service failed, the ranks keep planning locally
// (asking nothing) until every rank's background probe has been answered,
// then all go back to it at the same step (PlannerClientOptions::
// probe_interval). One client per rank; not thread-safe (one step at a
// time).
//
// Plan ahead: a trainer that knows step N+1's lengths while step N computes
// calls Prefetch for N+1 then; Plan for N+1 finds the answer there, or waits
// only for what is left of it. Only the RPC runs in the background: every
// collective on the transport is issued by the caller's thread, in the same
// order on every rank.
class PlannerClient {
 public:
  // `transport` must outlive the client; its size is the group's world size.
  static absl::StatusOr<std::unique_ptr<PlannerClient>> Create(PlannerClientOptions options,
                                                               Transport* transport);
  ~PlannerClient();

  // Collective over the transport: every rank calls it for the same `spec`
  // (spec.world_size == transport size), with its own sequence lengths.
  // Errors, the same on every rank: InvalidArgument / FailedPrecondition /
  // AlreadyExists naming the rank whose input was refused; errors of the
  // transport.
  // `previous` (optional) is this rank's measured compute time of an
  // earlier step, for the service's gamma fit.
  // With a Prefetch of spec.step() pending, Plan uses it: `previous` was
  // sent then and is ignored here, and a step whose spec (token_bytes
  // aside) or lengths differ from the prefetched ones fails on every rank
  // with FailedPrecondition naming the step and the rank.
  // `masks` (optional) are the attention masks of this rank's sequences,
  // one per length (attention_mask.h); in a step where any rank gives them,
  // every rank with sequences must, else every rank gets InvalidArgument
  // naming the first rank without. The plan's attention_masks then list
  // the masks of the sequences this rank's attention sees.
  // `refused` (optional): an input this rank's caller could not read (a
  // binding's verdict on its masks); the rank still joins the step, and
  // every rank fails it with this error, naming this rank.
  absl::StatusOr<StepPlan> Plan(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                                const v1::StepTiming* previous = nullptr,
                                const std::vector<AttentionMask>& masks = {},
                                const absl::Status& refused = absl::OkStatus());

  // Starts planning `spec.step()` ahead; its Plan call follows, with the
  // same spec and lengths. Call it on every rank (or on none) for a step: in
  // group mode it is a collective (the lengths' all-gather, on the caller's
  // thread), and then rank 0 asks the service on a background thread; in
  // per-rank mode each rank's request goes out on a background thread (the
  // first call with a service agrees on the incarnation, a collective). A
  // later Prefetch replaces one that no Plan used. Errors: the transport's,
  // and in group mode the agreed errors of the all-gather (ranks that
  // disagree on the spec, a rank whose world size is not the transport's);
  // everything else is reported by the step's Plan, on every rank alike.
  absl::Status Prefetch(const v1::StepSpec& spec, const std::vector<int64_t>& lengths,
                        const v1::StepTiming* previous = nullptr,
                        const std::vector<AttentionMask>& masks = {},
                        const absl::Status& refused = absl::OkStatus());

  // The incarnation this client's requests carry (see
  // PlannerClientOptions::incarnation); 0 until the first request to a
  // service. In group mode only rank 0 sends requests, and only its is set.
  uint64_t incarnation() const;

 private:
  struct Rep;
  explicit PlannerClient(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_CLIENT_H_
