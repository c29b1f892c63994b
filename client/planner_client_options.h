#ifndef KNAPFORMER_CLIENT_PLANNER_CLIENT_OPTIONS_H_
#define KNAPFORMER_CLIENT_PLANNER_CLIENT_OPTIONS_H_

// How a PlannerClient (planner_client.h) reaches the planner service, and
// when it plans locally instead.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/planner_credentials.h"
#include "planner/balancer.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace knapformer {

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
  // Null = from `tls` (plaintext when it names no file).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // TLS to the planner from PEM files (planner_credentials.h), read when the
  // client is made; ignored when `credentials` is set.
  PlannerTls tls;
  // The job token of a planner run with --auth=token (`knapformer token
  // --job ID --ttl 30d` mints it for this job id), sent as "authorization:
  // Bearer <token>" with every call, probes included. Never in clear over a
  // network: Create refuses a token without TLS (`tls`) unless the address
  // stays on this machine (PlannerTargetIsLocal) or mesh_tls says a service
  // mesh encrypts the connection. (Given `credentials`, the caller vouches
  // for them.) Empty = none.
  std::string token;
  // A service mesh (a sidecar proxy: Istio, Linkerd) encrypts the
  // connection to the planner, so the token may leave over plaintext.
  bool mesh_tls = false;
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
  // The largest answer the client takes from the service (bytes): a
  // larger one (a buggy or hostile service) is refused before it is parsed
  // (RESOURCE_EXHAUSTED, the step planned locally), so that rank 0, which
  // rebroadcasts the answer to its group, never holds more. The default fits
  // the whole plan of the server's largest step (4M sequences).
  int64_t max_answer_bytes = int64_t{256} << 20;
  // The run's incarnation (StepSpec.incarnation), unless the spec sets one:
  // 0 = the ranks agree on a random one at their first step (one small
  // all-gather of rank 0's draw). The service keeps each incarnation's steps apart, so a run
  // restarted from a checkpoint replays its step numbers without conflicts
  // and other runs of the same job id never meet it. Set it only to make a
  // run's requests reproducible.
  uint64_t incarnation = 0;
  PlannerMode mode = PlannerMode::kGroup;
  // A step the service cannot plan (down, unreachable, refusing it for a
  // conflict) fails with Unavailable on every rank instead of being planned
  // locally. Needs an address.
  bool require_service = false;
  // Rank 0 logs one line per planned step (StepLine, client/step_plan.h):
  // where the plan came from, the bags, max/mean before and after, the
  // tokens moved and the time the step waited for its plan.
  bool log_steps = false;
  // For local planning (the service uses its own). balancer.rank_speeds:
  // declared relative speeds of the ranks (planner/rank_speeds.h).
  BalancerOptions balancer;
  // Learn each rank's speed from the ranks' timings (the `previous` of each
  // Plan, planner/speed_learner.h) and plan by them; every rank learns the
  // same from the timings the step's all-gather brings. Instead of declared
  // speeds. Declared or learned, speeds need group mode: rank 0's request
  // carries them (PlanGroupRequest.rank_speeds), so any planner replica
  // plans by them, and a local plan uses the same.
  bool learn_rank_speeds = false;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_CLIENT_OPTIONS_H_
