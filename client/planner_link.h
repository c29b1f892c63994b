#ifndef KNAPFORMER_CLIENT_PLANNER_LINK_H_
#define KNAPFORMER_CLIENT_PLANNER_LINK_H_

// One rank's gRPC link to the planner service: the channel, a step's call
// with its retries and shared deadline, a call on a background thread that
// the step can cancel, and the background probe that tells when a failed
// service answers again. No collectives: what the ranks agree on is the
// PlannerClient's.

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"

namespace knapformer {

struct PlannerLinkOptions {
  std::string address;  // a gRPC target: host:port, dns:///NAME:PORT, ipv4:a:p,b:q
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = plaintext
  std::string token;  // sent with every call as "authorization: Bearer"; empty = none
  // A group's link (rank 0 asks for every rank): spreads steps over the
  // target's replicas (round_robin) and pings a call's replica to find a
  // hung one. Else pick_first, no pings (per-rank mode's ranks must meet in
  // one replica, and wait in its rendezvous).
  bool spread_over_replicas = true;
  // PlannerClientOptions' fields of the same names (which say what each
  // does, and their defaults); REQUIRES: each duration > 0, max_attempts >= 1.
  absl::Duration call_deadline;
  int max_attempts = 1;
  absl::Duration initial_backoff;
  absl::Duration max_backoff;
  absl::Duration probe_interval;
  absl::Duration probe_deadline;
  int64_t max_answer_bytes = 0;  // REQUIRES: in 1..INT32_MAX
};

// Lets a caller stop a call running on another thread: it cancels the
// attempt in flight and the backoff sleep between attempts. Thread-safe.
class CancelToken {
 public:
  // False, and nothing is registered, once cancelled.
  bool Enter(grpc::ClientContext* context);
  void Leave();
  // False if cancelled while sleeping.
  bool SleepFor(absl::Duration duration);
  void Cancel();

 private:
  absl::Mutex mu_;
  grpc::ClientContext* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// A call on its own thread, so that a step is planned while the previous
// one computes. Destroying it cancels the call and waits for the thread.
class BackgroundCall {
 public:
  explicit BackgroundCall(std::function<grpc::Status(CancelToken*)> body);
  ~BackgroundCall();
  // The call's status, once it ended. Call once, from the owner's thread.
  grpc::Status Wait();

 private:
  CancelToken token_;
  grpc::Status status_;  // written by thread_, read after joining it
  std::thread thread_;   // last: starts once the others exist
};

// The link. Plan/PlanGroup may run on any thread (one at a time per
// request object); the probe runs on a thread of its own.
class PlannerLink {
 public:
  explicit PlannerLink(PlannerLinkOptions options);
  ~PlannerLink();

  // One step's request, retried on UNAVAILABLE (with several replicas, each
  // attempt goes to the next ready one) within call_deadline, shared by the
  // attempts: the second at once, later ones after an exponential backoff.
  // The last attempt's status; CANCELLED once `token` (optional) cancels.
  grpc::Status Plan(const v1::PlanRequest& request, v1::PlanResponse* response,
                    CancelToken* token = nullptr);
  grpc::Status PlanGroup(const v1::PlanGroupRequest& request, v1::PlanGroupResponse* response,
                         CancelToken* token = nullptr);

  // Starts probing (again) in the background, forgetting earlier answers: a
  // GetJob of `job_id` with probe_deadline every probe_interval. Any answer
  // from the service (NOT_FOUND included) counts; no answer (UNAVAILABLE,
  // DEADLINE_EXCEEDED) does not. Steps only read the last result, so a
  // hung service never stalls one.
  void StartProbing(const std::string& job_id);
  void StopProbing();
  // Whether the last probe since StartProbing was answered.
  bool probe_answered() const;

  const std::string& address() const { return options_.address; }

 private:
  grpc::Status CallWithRetries(CancelToken* token,
                               const std::function<grpc::Status(grpc::ClientContext*)>& call);
  void ProbeLoop();
  bool ProbingOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PlannerLinkOptions options_;
  std::unique_ptr<v1::Planner::Stub> stub_;

  mutable absl::Mutex mu_;
  std::string probed_job_ ABSL_GUARDED_BY(mu_);
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  bool probe_answered_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread prober_;  // started by the first StartProbing; joined by the destructor
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_LINK_H_
