#include "bench/bare_rendezvous.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "knapformer/v1/planner.grpc.pb.h"

namespace knapformer {
namespace {

class BareRendezvousService final : public v1::Planner::CallbackService {
 public:
  explicit BareRendezvousService(int reply_padding_bytes)
      : padding_(static_cast<size_t>(reply_padding_bytes), 'x') {}

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const v1::PlanRequest* request,
                                 v1::PlanResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::vector<Waiting> complete;
    {
      absl::MutexLock lock(&mu_);
      const StepKey key(request->spec().job_id(), request->spec().step());
      std::vector<Waiting>& waiting = steps_[key];
      waiting.push_back({reactor, request, response});
      if (static_cast<int64_t>(waiting.size()) < request->spec().world_size()) return reactor;
      complete = std::move(waiting);
      steps_.erase(key);
    }
    // As the prototype of the floor did: the last rank's thread answers all.
    for (const Waiting& call : complete) {
      const v1::StepSpec& spec = call.request->spec();
      call.response->set_job_id(spec.job_id());
      call.response->set_group_id(padding_);
      call.response->set_step(spec.step());
      call.response->mutable_plan()->set_rank(call.request->rank());
      call.reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

 private:
  struct Waiting {
    grpc::ServerUnaryReactor* reactor;
    const v1::PlanRequest* request;
    v1::PlanResponse* response;
  };
  using StepKey = std::pair<std::string, uint64_t>;

  const std::string padding_;
  absl::Mutex mu_;
  std::map<StepKey, std::vector<Waiting>> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<BareRendezvousServer> StartBareRendezvous(int reply_padding_bytes) {
  BareRendezvousServer bare;
  bare.service = std::make_unique<BareRendezvousService>(reply_padding_bytes);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bare.port);
  builder.RegisterService(bare.service.get());
  bare.server = builder.BuildAndStart();
  if (bare.server == nullptr || bare.port == 0) {
    return absl::UnavailableError("the bare rendezvous server did not start on 127.0.0.1:0");
  }
  return bare;
}

}  // namespace knapformer
