#ifndef KNAPFORMER_TESTS_SERVER_SERVICE_TEST_UTIL_H_
#define KNAPFORMER_TESTS_SERVER_SERVICE_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balancer.h"

namespace knapformer {
namespace testing_util {

// A plaintext channel to 127.0.0.1:port. Client retries are off (the tests
// count every call), and `index` makes a distinct connection per value.
std::shared_ptr<grpc::Channel> LocalChannel(int port, int index = 0);

// The code a server reachable over `channel` answers a call of gRPC's
// reflection service with: UNIMPLEMENTED where it does not serve it.
grpc::StatusCode ReflectionCode(const std::shared_ptr<grpc::Channel>& channel);

struct StepParams {
  std::string job_id = "job";
  std::string group_id;
  uint64_t step = 0;
  std::string topology = "g1n2+g2n1+g4n1";
  int32_t d_model = 64;
  double gamma = 0.5;
  int64_t token_bytes = 0;
};

v1::PlanRequest MakeRequest(const StepParams& params, int32_t world_size, int32_t rank,
                            const std::vector<int64_t>& lengths);

// One request per rank of `lengths`.
std::vector<v1::PlanRequest> MakeGroupRequests(const StepParams& params,
                                               const RankLengths& lengths);

// The group's one PlanGroup request: the spec of MakeRequest for
// lengths.size() ranks and every rank's lengths.
v1::PlanGroupRequest MakePlanGroupRequest(const StepParams& params, const RankLengths& lengths);

// Up to `max_sequences` sequences per rank of 0..max_length tokens, from `seed`.
RankLengths RandomLengths(int32_t world_size, uint64_t seed, int max_sequences = 6,
                          int64_t max_length = 4096);

// One Plan call in flight. The request is copied, so it may go away.
class AsyncPlan {
 public:
  AsyncPlan(v1::Planner::Stub* stub, v1::PlanRequest request,
            absl::Duration deadline = absl::Seconds(30));
  ~AsyncPlan();  // cancels and waits (bounded) if still running

  // True once the call has finished; waits at most `timeout`.
  bool WaitFor(absl::Duration timeout);
  void Cancel() { context_.TryCancel(); }

  // REQUIRES: WaitFor returned true.
  const grpc::Status& status() const { return status_; }
  const v1::PlanResponse& response() const { return response_; }
  const v1::PlanRequest& request() const { return request_; }

 private:
  v1::PlanRequest request_;
  v1::PlanResponse response_;
  grpc::ClientContext context_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_;
};

// Sends every request at once and waits (at most `timeout`) for every answer.
// Calls not finished in time have status DEADLINE_EXCEEDED "test timeout".
struct PlanResult {
  grpc::Status status;
  v1::PlanResponse response;
};
std::vector<PlanResult> PlanConcurrently(v1::Planner::Stub* stub,
                                         const std::vector<v1::PlanRequest>& requests,
                                         absl::Duration timeout = absl::Seconds(30));

// What trainer ranks and load balancers keep open to a planner while it
// stops: a channel that has planned one g1n2 step and is now idle, and a
// health Watch stream on the whole server (30 s deadline) whose first update
// has been read.
class IdleClientWithHealthWatch {
 public:
  explicit IdleClientWithHealthWatch(int port);

  // Empty when all of the above happened; else what failed.
  const std::string& error() const { return error_; }
  // The first update's status (SERVING while the planner is up).
  grpc::health::v1::HealthCheckResponse::ServingStatus first_status() const {
    return first_.status();
  }
  // Reads the watch to its end; how it ended.
  grpc::Status FinishWatch();

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  grpc::ClientContext watch_context_;
  std::unique_ptr<grpc::ClientReader<grpc::health::v1::HealthCheckResponse>> watch_;
  grpc::health::v1::HealthCheckResponse first_;
  std::string error_;
};

// The body of GET http://127.0.0.1:port/path (HTTP/1.0, 5 s timeout), or an
// error naming what failed.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// `name` under the test's temporary directory ($TEST_TMPDIR, else /tmp).
std::string TempPath(const std::string& name);

// The whole file at `path` ("" if it cannot be read).
std::string ReadFile(const std::string& path);

// Throwaway certificates from openssl in `dir` (made if missing): ca.pem
// and ca.key; server.pem and server.key for 127.0.0.1; and for each client
// NAME, NAME.pem and NAME.key signed by the CA, with the client's subject
// alternative names (openssl's form: "URI:spiffe://d/ns/a/sa/b,DNS:job-b";
// empty: none). False, with openssl's output in *log, when it fails.
struct TestClientCert {
  std::string name;
  std::string alt_names;
};
bool MakeTlsFiles(const std::string& dir, const std::vector<TestClientCert>& clients,
                  std::string* log);

// Runs `command` through /bin/sh with `input` on its stdin; returns its exit
// status (-1 if it could not run) and appends its stdout+stderr to *output.
int RunWithInput(const std::string& command, const std::string& input, std::string* output);

}  // namespace testing_util
}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_SERVER_SERVICE_TEST_UTIL_H_
