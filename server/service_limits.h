#ifndef KNAPFORMER_SERVER_SERVICE_LIMITS_H_
#define KNAPFORMER_SERVER_SERVICE_LIMITS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace knapformer {

// Characters in a job or group id, a fixed bound (no flag): a Kubernetes
// Job's namespace/name/uid fits. Checked on the wire (request_scan.h) and
// once parsed (request_check.h).
inline constexpr int64_t kMaxIdLength = 256;

// Bounds on what one planner server accepts and keeps. Each has a flag in
// `knapformer serve`; exceeding one is RESOURCE_EXHAUSTED (a count or size)
// or DEADLINE_EXCEEDED (the rendezvous timeout), with a message naming it.
struct ServiceLimits {
  // Ranks in one group: the largest clusters (docs/service.md, "Groups of
  // 65,536 ranks"). Memory per pending step is O(world_size / 8) bytes plus
  // the requests themselves, which the request memory limits below bound
  // before they are parsed.
  int32_t max_world_size = 65536;
  // Sequences in one rank's request, and in one step of a group (summed
  // over its ranks, or in one PlanGroup request).
  int64_t max_sequences_per_rank = 1 << 16;
  int64_t max_sequences_per_step = 1 << 20;
  // Spans of SPANS attention masks in one step (summed over its ranks).
  int64_t max_mask_spans_per_step = 1 << 20;
  // Steps waiting for ranks, over all jobs and per job (so that one job
  // flooding the server, by mistake or not, cannot keep the others' steps
  // from opening). A client that pipelines k steps ahead holds k per group.
  int32_t max_pending_steps = 1024;
  int32_t max_pending_steps_per_job = 256;
  // Jobs the server tracks at once (state and metric labels), those of one
  // tenant (the scope of the callers' credentials, job_auth.h; under --auth
  // none each job is its own tenant), and groups per job.
  int32_t max_jobs = 256;
  int32_t max_jobs_per_tenant = 64;
  int32_t max_groups_per_job = 1024;
  // Steps solved on the pool (larger ones; all with an answer delay) that may
  // wait for a solver thread; a step beyond is refused at once rather than
  // queued without bound.
  int32_t max_queued_solves = 256;
  // A step that waited longer for a solver thread (from the moment it was
  // complete, injected answer delay included) is refused with
  // DEADLINE_EXCEEDED and not solved: under overload the queue serves steps
  // whose ranks still wait, not answers nobody will use. Waiting steps take
  // the solver threads round-robin between jobs (fair_queue.h).
  absl::Duration max_solve_wait = absl::Seconds(10);
  // PlanGroup calls being checked, queued or solved, in all, per tenant and
  // per job: a job that floods the server (a retry loop, a tenant's stray
  // ids) holds at most its share, and the others' steps still get solver
  // time. A tenant past an eighth of the total may not take the last eighth
  // (TenantQuota's reserve, kept for tenants holding less).
  int32_t max_plan_group_calls = 256;
  int32_t max_plan_group_calls_per_tenant = 32;
  int32_t max_plan_group_calls_per_job = 16;
  // Largest request gRPC accepts (bytes); 0 = the largest request the
  // limits above admit (MaxRequestWireBytes, request_scan.h).
  int32_t max_message_bytes = 0;
  // Memory of the requests being parsed and held (a per-rank request waits
  // in its step's rendezvous), in all, per tenant and per job, as estimated
  // from the request's wire form before it is parsed (EstimatedParsedBytes):
  // a call that would pass any is refused, and nothing of it is parsed. A
  // tenant past an eighth of the total may not take the last eighth.
  int64_t max_request_memory = int64_t{512} << 20;
  int64_t max_request_memory_per_tenant = int64_t{256} << 20;
  int64_t max_request_memory_per_job = int64_t{256} << 20;
  // A step not complete this long after its first request fails every waiting
  // rank with DEADLINE_EXCEEDED.
  absl::Duration rendezvous_timeout = absl::Seconds(60);
  // A job without requests for this long, and with no pending step, is
  // forgotten (its state and its metric series).
  absl::Duration job_ttl = absl::Hours(1);
  // Answered steps remembered per group, so a repeated request for one of them
  // gets ALREADY_EXISTS instead of opening a rendezvous that never completes.
  int32_t remembered_steps = 64;
  // Online gamma fit: steps per group whose per-rank work is kept to pair
  // with timings that arrive later, and timing samples kept per job (the
  // most recent). A fit needs at least min_timing_samples.
  int32_t timed_steps = 8;
  int32_t timing_window = 4096;
  int32_t min_timing_samples = 16;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_SERVICE_LIMITS_H_
