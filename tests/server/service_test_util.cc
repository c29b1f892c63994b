#include "tests/server/service_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"

namespace knapformer {
namespace testing_util {

std::shared_ptr<grpc::Channel> LocalChannel(int port, int index) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt("knapformer.test_channel_index", index);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

grpc::StatusCode ReflectionCode(const std::shared_ptr<grpc::Channel>& channel) {
  // A bidi method called as unary: a serving reflection answers (an empty
  // request is one it reports on, then the call ends).
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::ByteBuffer request, response;
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  absl::Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                 grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
                   absl::MutexLock lock(&mu);
                   status = std::move(s);
                   done = true;
                 });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  return status.error_code();
}

v1::PlanRequest MakeRequest(const StepParams& params, int32_t world_size, int32_t rank,
                            const std::vector<int64_t>& lengths) {
  v1::PlanRequest request;
  v1::StepSpec* spec = request.mutable_spec();
  spec->set_job_id(params.job_id);
  spec->set_group_id(params.group_id);
  spec->set_step(params.step);
  spec->set_world_size(world_size);
  spec->set_topology(params.topology);
  spec->set_d_model(params.d_model);
  spec->set_gamma(params.gamma);
  spec->set_token_bytes(params.token_bytes);
  request.set_rank(rank);
  request.mutable_sequence_lengths()->Add(lengths.begin(), lengths.end());
  return request;
}

std::vector<v1::PlanRequest> MakeGroupRequests(const StepParams& params,
                                               const RankLengths& lengths) {
  std::vector<v1::PlanRequest> requests;
  const int32_t world = static_cast<int32_t>(lengths.size());
  for (int32_t r = 0; r < world; ++r) requests.push_back(MakeRequest(params, world, r, lengths[r]));
  return requests;
}

v1::PlanGroupRequest MakePlanGroupRequest(const StepParams& params, const RankLengths& lengths) {
  v1::PlanGroupRequest request;
  *request.mutable_spec() =
      MakeRequest(params, static_cast<int32_t>(lengths.size()), 0, {}).spec();
  request.mutable_ranks()->Reserve(static_cast<int>(lengths.size()));
  for (const auto& rank : lengths) {
    request.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
  }
  return request;
}

RankLengths RandomLengths(int32_t world_size, uint64_t seed, int max_sequences,
                          int64_t max_length) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state]() {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  RankLengths lengths(world_size);
  for (auto& rank : lengths) {
    const int n = static_cast<int>(next() % (max_sequences + 1));
    for (int i = 0; i < n; ++i) rank.push_back(static_cast<int64_t>(next() % (max_length + 1)));
  }
  return lengths;
}

AsyncPlan::AsyncPlan(v1::Planner::Stub* stub, v1::PlanRequest request, absl::Duration deadline)
    : request_(std::move(request)) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  stub->async()->Plan(&context_, &request_, &response_, [this](grpc::Status status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    done_ = true;
  });
}

AsyncPlan::~AsyncPlan() {
  if (!WaitFor(absl::ZeroDuration())) {
    context_.TryCancel();
    WaitFor(absl::Seconds(10));
  }
}

bool AsyncPlan::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

std::vector<PlanResult> PlanConcurrently(v1::Planner::Stub* stub,
                                         const std::vector<v1::PlanRequest>& requests,
                                         absl::Duration timeout) {
  std::vector<std::unique_ptr<AsyncPlan>> calls;
  for (const v1::PlanRequest& request : requests) {
    calls.push_back(std::make_unique<AsyncPlan>(stub, request, timeout));
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<PlanResult> results(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i]->WaitFor(deadline - absl::Now())) {
      results[i] = PlanResult{calls[i]->status(), calls[i]->response()};
    } else {
      results[i].status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "test timeout");
    }
  }
  return results;
}

IdleClientWithHealthWatch::IdleClientWithHealthWatch(int port)
    : channel_(LocalChannel(port)), health_(grpc::health::v1::Health::NewStub(channel_)) {
  auto stub = v1::Planner::NewStub(channel_);
  StepParams params;
  params.job_id = "idle";
  params.topology = "g1n2";
  for (const PlanResult& r : PlanConcurrently(stub.get(), MakeGroupRequests(params, {{1}, {2}}))) {
    if (!r.status.ok()) {
      error_ = absl::StrCat("the step before the watch failed: ", r.status.error_message());
      return;
    }
  }
  watch_context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  watch_ = health_->Watch(&watch_context_, grpc::health::v1::HealthCheckRequest());
  if (!watch_->Read(&first_)) error_ = "the health watch ended before its first update";
}

grpc::Status IdleClientWithHealthWatch::FinishWatch() {
  if (watch_ == nullptr) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, error_);
  grpc::health::v1::HealthCheckResponse update;
  while (watch_->Read(&update)) {
  }
  return watch_->Finish();
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to 127.0.0.1:", port));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("short write");
  }
  std::string reply;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) reply.append(buffer, n);
  close(fd);
  if (reply.compare(0, 12, "HTTP/1.1 200") != 0 && reply.compare(0, 12, "HTTP/1.0 200") != 0) {
    return absl::UnavailableError(absl::StrCat("bad reply: ", reply.substr(0, 80)));
  }
  const size_t body = reply.find("\r\n\r\n");
  if (body == std::string::npos) return absl::UnavailableError("no HTTP body");
  return reply.substr(body + 4);
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool MakeTlsFiles(const std::string& dir, const std::vector<TestClientCert>& clients,
                  std::string* log) {
  std::string script = absl::StrCat(
      "set -e; mkdir -p ", dir, "; cd ", dir, ";",
      "printf 'subjectAltName=IP:127.0.0.1\\n' > server.ext;"
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
      "  -keyout ca.key -out ca.pem;",
      "openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key "
      "  -out server.csr;",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "  -extfile server.ext -out server.pem;");
  for (const TestClientCert& client : clients) {
    const std::string& n = client.name;
    absl::StrAppend(&script, "openssl req -newkey rsa:2048 -nodes -subj /CN=", n, " -keyout ",
                    n, ".key -out ", n, ".csr;");
    std::string extfile;
    if (!client.alt_names.empty()) {
      absl::StrAppend(&script, "printf 'subjectAltName=", client.alt_names, "\\n' > ", n,
                      ".ext;");
      extfile = absl::StrCat(" -extfile ", n, ".ext");
    }
    absl::StrAppend(&script, "openssl x509 -req -in ", n, ".csr -CA ca.pem -CAkey ca.key ",
                    "-CAcreateserial -days 1", extfile, " -out ", n, ".pem;");
  }
  return RunWithInput(script, "", log) == 0;
}

int RunWithInput(const std::string& command, const std::string& input, std::string* output) {
  const std::string base = TempPath(absl::StrCat("run_", getpid()));
  {
    std::ofstream in(base + ".in", std::ios::binary);
    in << input;
  }
  const std::string line =
      absl::StrCat("(", command, ") < ", base, ".in > ", base, ".out 2>&1");
  const int status = std::system(line.c_str());
  output->append(ReadFile(base + ".out"));
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace testing_util
}  // namespace knapformer
