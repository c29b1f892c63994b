#ifndef KNAPFORMER_BENCH_BARE_RENDEZVOUS_H_
#define KNAPFORMER_BENCH_BARE_RENDEZVOUS_H_

// The floor the planner service's per-rank mode is measured against: a gRPC
// callback server that speaks the same Plan RPC, holds every call of a step
// until all `spec.world_size` ranks have asked, and then answers each with a
// reply of the planner's size but no plan in it (no validation, no solve, no
// metrics). What it costs per call is what gRPC itself costs per call here.

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace knapformer {

struct BareRendezvousServer {
  std::unique_ptr<grpc::Service> service;  // outlives `server`'s calls
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Serves on 127.0.0.1 (a free port); `reply_padding_bytes` of filler go into
// each answer so that it weighs what a planner answer weighs.
absl::StatusOr<BareRendezvousServer> StartBareRendezvous(int reply_padding_bytes);

}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_BARE_RENDEZVOUS_H_
