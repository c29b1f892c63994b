#ifndef KNAPFORMER_CLIENT_PLANNER_CLIENT_H_
#define KNAPFORMER_CLIENT_PLANNER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/balancer.h"
#include "planner/plan.h"
#include "transport/transport.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace knapformer {

enum class PlanSource { kService, kLocal };
const char* PlanSourceName(PlanSource source);

// How the ranks of a group ask the planner service.
enum class PlannerMode {
  // The ranks all-gather their lengths over the transport; rank 0 alone
  // asks the service (PlanGroup: one request, one chunk table back) and
  // broadcasts the answer; every rank rebuilds the plan from the table and
  // takes its own slice (planner/plan_from_chunks.h). The server's work per
  // step does not grow with the ranks' calls, only rank 0 holds a channel,
  // and when the service fails every rank already has every length to plan
  // locally. The default: measured faster per step at every size (README,
  // "Load").
  kGroup,
  // Every rank sends its own lengths (Plan) and gets its own slice; the
  // service meets the ranks in a rendezvous. For trainers whose ranks cannot
  // all-gather before the step, or that want the service's memory of
  // answered steps (ALREADY_EXISTS on a replay).
  kPerRank,
};
const char* PlannerModeName(PlannerMode mode);
// "group" or "per-rank"; InvalidArgument naming both otherwise.
absl::StatusOr<PlannerMode> ParsePlannerMode(const std::string& name);

struct PlannerClientOptions {
  // The planner service as a gRPC target; empty = always plan locally.
  // host:port names one planner; a target naming several replicas
  // (dns:///NAME:PORT of a headless Service, ipv4:a:p,b:q) spreads group
  // steps over them (round_robin), and a group step a replica refuses while
  // draining, loses when it dies, or holds while hung (a keepalive ping
  // unanswered for 1 s closes its connection), is retried on another within
  // call_deadline. Per-rank mode refuses such a target at Create
  // (InvalidArgument): its ranks must all meet in one replica
  // (planner_target.h says how replicas are counted).
  std::string address;
  // Null = plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of one step's request, shared by its attempts. Keep it longer
  // than the server's rendezvous timeout, so that a missing rank is
  // reported by the server (naming it).
  absl::Duration call_deadline = absl::Seconds(90);
  // Attempts when the service answers UNAVAILABLE (restarting, shutting
  // down, unreachable; with several replicas, each attempt goes to the next
  // ready one), within call_deadline: the second at once, the later ones
  // after an exponential backoff (initial_backoff, doubled up to
  // max_backoff).
  int max_attempts = 4;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // After a step the service failed (an error, a deadline, a hang), the
  // ranks plan locally without asking it, while each probes it in the
  // background (GetJob, this deadline, every probe_interval); when every
  // rank's last probe was answered, the next step asks it again. So a
  // planner that dies or hangs costs one step (at most call_deadline), not
  // every step.
  absl::Duration probe_interval = absl::Seconds(1);
  absl::Duration probe_deadline = absl::Seconds(1);
  // The run's incarnation (StepSpec.incarnation), unless the spec sets one:
  // 0 = the ranks agree on a random one at their first step (one 8-byte
  // all-gather). The service keeps each incarnation's steps apart, so a run
  // restarted from a checkpoint replays its step numbers without conflicts
  // and other runs of the same job id never meet it. Set it only to make a
  // run's requests reproducible.
  uint64_t incarnation = 0;
  PlannerMode mode = PlannerMode::kGroup;
  // A step the service cannot plan (down, unreachable, refusing it for a
  // conflict) fails with Unavailable on every rank instead of being planned
  // locally. Needs an address.
  bool require_service = false;
  // For local planning (the service uses its own).
  BalancerOptions balancer;
};

// One rank's plan for one step, and how it was made.
struct StepPlan {
  RankPlan plan;
  PlanSource source = PlanSource::kLocal;
  double max_over_mean_before = 1;
  double max_over_mean_after = 1;
  int64_t total_tokens = 0;
  int64_t moved_tokens = 0;
  // The bags the step was planned on (v1::Balance.layout): under topology
  // "auto", the layout the planner chose for this step.
  std::string layout;
  // One transformer block's forward on the slowest GPU, compute plus
  // communication, as the planner predicts it (0 when it does not).
  double predicted_step_seconds = 0;
  // Every rank's cost-model workload (by rank of the group) without
  // balancing and under this plan: what WIR and max/mean are computed from.
  std::vector<double> workload_before;
  std::vector<double> workload_after;
  // The whole group's plan where this rank has it: planned locally, or from
  // the service in group mode (per-rank mode's answers are one rank's
  // slice; null then). Shared so that keeping it costs no copy.
  std::shared_ptr<const Plan> whole;
  // Steps of this client planned locally although a service is configured,
  // this one included, and why the last of them was.
  int64_t local_steps = 0;
  std::string local_reason;
  // Under StepSpec.use_fitted_gamma: why the service's fitted gamma did not
  // plan this step (too few timings, a failed fit, a local plan); empty
  // when it did.
  std::string gamma_note;
  // The gamma the step was planned with, when the service says (under
  // use_fitted_gamma); 0 = the spec's.
  double gamma_used = 0;
  // Whether the step was requested ahead (PlannerClient::Prefetch).
  bool prefetched = false;
  // Wall time this rank spent in Plan for the step: what the step waited
  // for its plan (the answer, or what is left of a prefetched one, and the
  // collectives that agree on it).
  double wait_seconds = 0;
  // Of wait_seconds, the time this rank was blocked on the service's answer
  // (0 where it asked nothing: in group mode every rank but rank 0, which
  // wait for rank 0 in its broadcast instead).
  double service_wait_seconds = 0;
};

// Gets each step's plan for one rank: from the planner service when one is
// configured and answers, else by all-gathering every rank's lengths over
// the transport and solving locally with the planner core (every rank then
// computes the identical plan). The ranks always agree on the source: after
// asking the service, they all-gather one status byte, and if any rank did
// not get its plan, all of them plan locally. The source is logged when it
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
