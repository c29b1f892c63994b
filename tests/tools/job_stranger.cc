// A stranger to a running job, with a valid credential of its own (the
// KNAPFORMER_PLANNER_TOKEN and KNAPFORMER_PLANNER_TLS_* variables, as a
// trainer's), against a planner run with --auth:
//   job_stranger PORT VICTIM OWN_JOB SECONDS
// For SECONDS it tries, over and over, what a stranger could do to VICTIM
// on a planner that trusts every caller: read its state (GetJob: its
// incarnation), open its next per-rank steps before its ranks do (Plan),
// reset its group with another incarnation, and feed its gamma fit timings
// with work values of their own (PlanGroup with previous timings), plus the
// same without any token, and with each token of KNAPFORMER_STRANGER_BAD_TOKENS
// (comma-separated: stretched, expired, revoked, another key's), which must
// not act even as OWN_JOB. Every call must be refused (PERMISSION_DENIED
// with its own token; UNAUTHENTICATED without one or with a bad one), alike.
// Then it plans 8 steps of OWN_JOB through PlanGroup, each with 4 ranks'
// timings of the previous step (a gamma fit's worth), which must all be
// answered. Exit 0 when everything answered as expected, 1 otherwise (naming
// the call), 2 for bad usage.
#include <cstdlib>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/planner_credentials.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "tests/server/service_test_util.h"

namespace knapformer {
namespace {

using testing_util::MakeRequest;
using testing_util::StepParams;

constexpr int kRanks = 4;
constexpr uint64_t kIncarnation = 0x5157a11;  // not the victim's (a random draw)

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

class Stranger {
 public:
  Stranger(std::shared_ptr<grpc::Channel> channel, std::string token)
      : stub_(v1::Planner::NewStub(std::move(channel))), token_(std::move(token)) {}

  // The token sent from now on.
  void set_token(std::string token) { token_ = std::move(token); }

  // GetJob, Plan and PlanGroup calls as the victim, `with_token` or without one.
  grpc::Status GetJob(const std::string& job, bool with_token) {
    grpc::ClientContext context;
    Prepare(&context, with_token);
    v1::GetJobRequest request;
    request.set_job_id(job);
    v1::JobState state;
    return stub_->GetJob(&context, request, &state);
  }
  grpc::Status Plan(const std::string& job, uint64_t step, int32_t rank, bool with_token) {
    grpc::ClientContext context;
    Prepare(&context, with_token);
    v1::PlanRequest request = MakeRequest(Params(job, step), kRanks, rank, {64, 32});
    request.mutable_spec()->set_incarnation(kIncarnation);
    v1::PlanResponse response;
    return stub_->Plan(&context, request, &response);
  }
  // A group step whose ranks report timings of step - 1, each with its own
  // work values: compute = 1e-6 * (linear + 0.5 * attention).
  grpc::Status PlanGroup(const std::string& job, uint64_t step, bool with_token) {
    grpc::ClientContext context;
    Prepare(&context, with_token);
    v1::PlanGroupRequest request;
    *request.mutable_spec() = MakeRequest(Params(job, step), kRanks, 0, {}).spec();
    request.mutable_spec()->set_incarnation(kIncarnation);
    for (int r = 0; r < kRanks; ++r) {
      request.add_ranks()->add_sequence_lengths(40 + 10 * r + static_cast<int64_t>(step));
      if (step == 0) continue;
      v1::StepTiming* timing = request.add_previous();
      timing->set_step(step - 1);
      const double linear = 1000.0 * (1 + r + step % 3);
      const double attention = 500.0 * (1 + (r * 7 + step) % 5);
      timing->set_linear_work(linear);
      timing->set_attention_work(attention);
      timing->set_compute_seconds(1e-6 * (linear + 0.5 * attention));
    }
    v1::PlanGroupResponse response;
    return stub_->PlanGroup(&context, request, &response);
  }

 private:
  static StepParams Params(const std::string& job, uint64_t step) {
    StepParams params;
    params.job_id = job;
    params.step = step;
    params.topology = "g1n4";
    return params;
  }
  void Prepare(grpc::ClientContext* context, bool with_token) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (with_token && !token_.empty()) {
      context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
    }
  }

  std::unique_ptr<v1::Planner::Stub> stub_;
  std::string token_;
};

int Run(int port, const std::string& victim, const std::string& own, double seconds) {
  PlannerTls tls{Env("KNAPFORMER_PLANNER_TLS_CA"), Env("KNAPFORMER_PLANNER_TLS_CERT"),
                 Env("KNAPFORMER_PLANNER_TLS_KEY")};
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls.enabled()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> made = PlannerChannelCredentials(tls);
    if (!made.ok()) {
      std::cerr << "stranger: " << made.status().message() << "\n";
      return 2;
    }
    credentials = *made;
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  Stranger stranger(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), credentials, args),
      Env("KNAPFORMER_PLANNER_TOKEN"));
  const bool has_token = *Env("KNAPFORMER_PLANNER_TOKEN") != '\0';
  const std::vector<std::string> bad_tokens =
      absl::StrSplit(Env("KNAPFORMER_STRANGER_BAD_TOKENS"), ',', absl::SkipEmpty());
  int failures = 0, refused = 0;
  auto expect = [&](const grpc::Status& status, grpc::StatusCode code, const std::string& what) {
    if (status.error_code() == code) {
      ++refused;
      return;
    }
    ++failures;
    std::cerr << "stranger: " << what << " answered " << status.error_code() << " "
              << status.error_message() << ", not " << code << "\n";
  };
  // Without a token, a token-checking planner says UNAUTHENTICATED; a
  // certificate-checking one still sees the certificate.
  const grpc::StatusCode without_token =
      has_token ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  for (uint64_t round = 0; absl::Now() < end; ++round) {
    expect(stranger.GetJob(victim, true), grpc::StatusCode::PERMISSION_DENIED, "GetJob");
    expect(stranger.GetJob(victim, false), without_token, "GetJob without a token");
    for (int32_t rank = 0; rank < kRanks; ++rank) {
      expect(stranger.Plan(victim, round, rank, true), grpc::StatusCode::PERMISSION_DENIED,
             absl::StrCat("Plan of step ", round, " rank ", rank));
    }
    expect(stranger.PlanGroup(victim, round + 1, true), grpc::StatusCode::PERMISSION_DENIED,
           absl::StrCat("PlanGroup of step ", round + 1, " with timings"));
    expect(stranger.PlanGroup(victim, round + 1, false), without_token,
           "PlanGroup without a token");
    for (size_t t = 0; t < bad_tokens.size(); ++t) {
      stranger.set_token(bad_tokens[t]);
      for (const std::string& job : {victim, own}) {
        const std::string what = absl::StrCat(" as ", job, " with bad token ", t);
        expect(stranger.GetJob(job, true), grpc::StatusCode::UNAUTHENTICATED, "GetJob" + what);
        expect(stranger.Plan(job, round, 0, true), grpc::StatusCode::UNAUTHENTICATED,
               "Plan" + what);
        expect(stranger.PlanGroup(job, round + 1, true), grpc::StatusCode::UNAUTHENTICATED,
               "PlanGroup" + what);
      }
    }
    stranger.set_token(Env("KNAPFORMER_PLANNER_TOKEN"));
    absl::SleepFor(absl::Milliseconds(50));
  }
  int planned = 0;
  for (uint64_t step = 0; step < 8; ++step) {
    const grpc::Status status = stranger.PlanGroup(own, step, true);
    if (status.ok()) {
      ++planned;
    } else {
      ++failures;
      std::cerr << "stranger: its own job's step " << step << ": " << status.error_message()
                << "\n";
    }
  }
  std::cout << "stranger: " << refused << " calls as " << victim << " refused, " << failures
            << " not; " << planned << " steps of " << own << " planned" << std::endl;
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  int port = 0;
  double seconds = 0;
  if (argc != 5 || !absl::SimpleAtoi(argv[1], &port) || !absl::SimpleAtod(argv[4], &seconds)) {
    std::cerr << "usage: job_stranger PORT VICTIM OWN_JOB SECONDS\n";
    return 2;
  }
  return knapformer::Run(port, argv[2], argv[3], seconds);
}
