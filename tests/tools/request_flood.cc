// Requests built to cost a planner the most memory per byte sent, all at
// once, each on a connection of its own:
//   request_flood PORT COUNT BYTES SHAPE EXPECTED_CODES [JOB...]
// sends COUNT requests of about BYTES each (alternately PlanGroup and Plan;
// held: Plan),
// as the jobs named (in turn; default "flood-N"), of one SHAPE:
//   zeros   lengths that are all zero: one byte each on the wire, eight or
//           more once parsed;
//   nested  a spec whose measured attention table holds nothing but unknown
//           varint fields: two bytes each, an entry of a growing array
//           parsed (the field a hand-written scan once skipped whole);
//   held    one rank's valid Plan request (a step of two ranks, each
//           request its own step) of empty sequences, each with its (full)
//           mask: three bytes each, about 200 parsed; admitted within the
//           limits, it waits for the other rank in the planner's
//           rendezvous, its memory held, until the call's deadline.
// Each must be refused with one of EXPECTED_CODES (gRPC code numbers,
// comma-separated: 8 RESOURCE_EXHAUSTED by gRPC's receive limit or memory
// quota, or by the planner before parsing; 16 UNAUTHENTICATED without a
// token; 4 DEADLINE_EXCEEDED for a held request admitted). Each call's
// deadline: KNAPFORMER_FLOOD_DEADLINE_MS (default 60000). Credentials, as a
// trainer's: KNAPFORMER_PLANNER_TOKEN, KNAPFORMER_PLANNER_TLS_CA. Prints one
// line per request and the seconds until the last answer; exit 0 when all
// were refused so, 1 otherwise, 2 for bad usage.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/planner_credentials.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.pb.h"
#include "tests/server/wire_bytes.h"

namespace knapformer {
namespace {

using testing_util::Field;
using testing_util::Tag;
using testing_util::Varint;

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// A PlanGroupRequest (rank 0 holding the payload) or a PlanRequest of
// about `bytes` bytes for step `step` of `job`.
std::string Request(bool group, const std::string& shape, int64_t bytes, const std::string& job,
                    uint64_t step) {
  if (shape == "held") {
    // One rank of two, so the step waits for the other in the planner's
    // rendezvous (its memory held) until the call ends.
    v1::PlanRequest request;
    request.mutable_spec()->set_job_id(job);
    request.mutable_spec()->set_step(step);
    request.mutable_spec()->set_world_size(2);
    request.mutable_spec()->set_topology("g1n2");
    request.mutable_spec()->set_d_model(64);
    request.set_rank(0);
    for (int64_t i = 0; i < std::max<int64_t>(1, bytes / 3); ++i) {
      request.add_sequence_lengths(0);
      request.add_attention_masks();
    }
    return request.SerializeAsString();
  }
  const std::string spec = Field(v1::StepSpec::kJobIdFieldNumber, job) +
                           Tag(v1::StepSpec::kWorldSizeFieldNumber, 0) + Varint(1) +
                           Field(v1::StepSpec::kTopologyFieldNumber, "g1n1");
  if (shape == "nested") {
    std::string table;
    table.reserve(bytes);
    const std::string unknown = Tag(99, 0) + Varint(0);
    while (static_cast<int64_t>(table.size()) < bytes) table += unknown;
    return Field(1, spec + Field(v1::StepSpec::kMeasuredAttentionFieldNumber, table));
  }
  const std::string lengths = Field(group ? 1 : 3, std::string(bytes, '\0'));
  return Field(1, spec) + (group ? Field(2, lengths) : lengths);
}

int Run(int port, int count, int64_t bytes, const std::string& shape,
        const std::set<int>& expected, std::vector<std::string> jobs) {
  if (jobs.empty()) {
    for (int i = 0; i < count; ++i) jobs.push_back(absl::StrCat("flood-", i));
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (*Env("KNAPFORMER_PLANNER_TLS_CA") != '\0') {
    PlannerTls tls;
    tls.ca_file = Env("KNAPFORMER_PLANNER_TLS_CA");
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> made = PlannerChannelCredentials(tls);
    if (!made.ok()) {
      std::cerr << "request_flood: " << made.status().message() << "\n";
      return 2;
    }
    credentials = *made;
  }
  const std::string token = Env("KNAPFORMER_PLANNER_TOKEN");
  std::vector<std::string> bodies;
  for (int i = 0; i < count; ++i) {
    bodies.push_back(Request(i % 2 == 0 && shape != "held", shape, bytes, jobs[i % jobs.size()],
                             static_cast<uint64_t>(i)));
  }
  int64_t deadline_ms = 60000;
  if (*Env("KNAPFORMER_FLOOD_DEADLINE_MS") != '\0' &&
      !absl::SimpleAtoi(Env("KNAPFORMER_FLOOD_DEADLINE_MS"), &deadline_ms)) {
    std::cerr << "request_flood: KNAPFORMER_FLOOD_DEADLINE_MS is not a number\n";
    return 2;
  }
  std::vector<grpc::ByteBuffer> requests(count);
  std::vector<grpc::ByteBuffer> responses(count);
  std::vector<grpc::ClientContext> contexts(count);
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  struct Answers {
    int done = 0;
    int refused = 0;
    int expected = 0;
    bool All() const { return done == expected; }
  };
  absl::Mutex mu;
  Answers answers;
  answers.expected = count;
  const absl::Time start = absl::Now();
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection each
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    stubs.push_back(std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), credentials, args)));
    grpc::Slice slice(bodies[i]);
    requests[i] = grpc::ByteBuffer(&slice, 1);
    contexts[i].set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(deadline_ms)));
    if (!token.empty()) contexts[i].AddMetadata("authorization", "Bearer " + token);
  }
  bodies.clear();  // the byte buffers hold their own copies
  for (int i = 0; i < count; ++i) {
    const bool group = i % 2 == 0 && shape != "held";
    stubs[i]->UnaryCall(&contexts[i],
                        group ? "/knapformer.v1.Planner/PlanGroup" : "/knapformer.v1.Planner/Plan",
                        grpc::StubOptions(), &requests[i], &responses[i],
                        [&, i, group](grpc::Status status) {
                          absl::MutexLock lock(&mu);
                          std::cout << "request " << i << " (" << (group ? "PlanGroup" : "Plan")
                                    << ", " << requests[i].Length() << " bytes): "
                                    << status.error_code() << " " << status.error_message()
                                    << std::endl;
                          if (expected.count(status.error_code()) > 0) ++answers.refused;
                          ++answers.done;
                        });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&answers, &Answers::All));
  std::cout << answers.refused << " of " << count << " requests answered as expected in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s" << std::endl;
  return answers.refused == count ? 0 : 1;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  int port = 0, count = 0;
  int64_t bytes = 0;
  const std::string shape = argc > 4 ? argv[4] : "";
  std::set<int> expected;
  bool codes = argc > 5;
  if (codes) {
    for (absl::string_view text : absl::StrSplit(argv[5], ',')) {
      int code = 0;
      codes = codes && absl::SimpleAtoi(text, &code);
      expected.insert(code);
    }
  }
  if (argc < 6 || !absl::SimpleAtoi(argv[1], &port) || !absl::SimpleAtoi(argv[2], &count) ||
      !absl::SimpleAtoi(argv[3], &bytes) || count < 1 || bytes < 1 ||
      (shape != "zeros" && shape != "nested" && shape != "held") || !codes) {
    std::cerr << "usage: request_flood PORT COUNT BYTES zeros|nested|held CODE[,CODE...] "
                 "[JOB...]\n";
    return 2;
  }
  return knapformer::Run(port, count, bytes, shape, expected,
                         std::vector<std::string>(argv + 6, argv + argc));
}
