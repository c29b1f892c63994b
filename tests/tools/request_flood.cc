// Requests built to cost a planner the most memory per byte sent, all at
// once, each on a connection of its own:
//   request_flood PORT COUNT BYTES
// sends COUNT requests of about BYTES each (alternately PlanGroup and Plan)
// whose lengths are all zero: one byte each on the wire, eight or more once
// parsed. Each must be refused with RESOURCE_EXHAUSTED (by gRPC's receive
// limit, or by the planner's count of sequences before parsing). Prints one
// line per request and the seconds until the last answer; exit 0 when all
// were refused so, 1 otherwise, 2 for bad usage.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tests/server/wire_bytes.h"

namespace knapformer {
namespace {

using testing_util::Field;
using testing_util::Tag;
using testing_util::Varint;

// A PlanGroupRequest (rank 0 holding `zeros` zero lengths) or a PlanRequest.
std::string ZeroLengths(bool group, int64_t zeros, int i) {
  const std::string spec = Field(1, Field(1, absl::StrCat("flood-", i)) +
                                        Tag(4, 0) + Varint(1) +  // world_size 1
                                        Field(5, "g1n1"));
  const std::string lengths = Field(group ? 1 : 3, std::string(zeros, '\0'));
  return spec + (group ? Field(2, lengths) : lengths);
}

int Run(int port, int count, int64_t bytes) {
  const std::string group_bytes = ZeroLengths(true, bytes, 0);
  const std::string plan_bytes = ZeroLengths(false, bytes, 1);
  grpc::Slice group_slice(group_bytes), plan_slice(plan_bytes);
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
    stubs.push_back(std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
    requests[i] = grpc::ByteBuffer(i % 2 == 0 ? &group_slice : &plan_slice, 1);
    contexts[i].set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  }
  for (int i = 0; i < count; ++i) {
    const bool group = i % 2 == 0;
    stubs[i]->UnaryCall(&contexts[i],
                        group ? "/knapformer.v1.Planner/PlanGroup" : "/knapformer.v1.Planner/Plan",
                        grpc::StubOptions(), &requests[i], &responses[i],
                        [&, i, group](grpc::Status status) {
                          absl::MutexLock lock(&mu);
                          std::cout << "request " << i << " (" << (group ? "PlanGroup" : "Plan")
                                    << ", " << requests[i].Length() << " bytes): "
                                    << status.error_code() << " " << status.error_message()
                                    << std::endl;
                          if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
                            ++answers.refused;
                          }
                          ++answers.done;
                        });
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&answers, &Answers::All));
  std::cout << answers.refused << " of " << count << " requests refused with RESOURCE_EXHAUSTED in "
            << absl::ToDoubleSeconds(absl::Now() - start) << " s" << std::endl;
  return answers.refused == count ? 0 : 1;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  int port = 0, count = 0;
  int64_t bytes = 0;
  if (argc != 4 || !absl::SimpleAtoi(argv[1], &port) || !absl::SimpleAtoi(argv[2], &count) ||
      !absl::SimpleAtoi(argv[3], &bytes) || count < 1 || bytes < 1) {
    std::cerr << "usage: request_flood PORT COUNT BYTES\n";
    return 2;
  }
  return knapformer::Run(port, count, bytes);
}
