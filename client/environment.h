#ifndef KNAPFORMER_CLIENT_ENVIRONMENT_H_
#define KNAPFORMER_CLIENT_ENVIRONMENT_H_

// The trainer-side environment (set by deploy/k8s): where the planner is and
// which job this is, so that a trainer needs no flags of its own for them.
//   KNAPFORMER_PLANNER_ADDRESS           the planner service as a gRPC target
//                                        (host:port, dns:///NAME:PORT,
//                                        ipv4:a:p,b:q); unset or empty = plan
//                                        locally
//   KNAPFORMER_JOB_ID                    the job (the service's key)
//   KNAPFORMER_GROUP_ID                  the balancing group within the job
//   KNAPFORMER_PLANNER_DEADLINE_SECONDS  deadline of one step's request
//                                        (its attempts share it), > 0
//   KNAPFORMER_REQUIRE_PLANNER           1/true: a step the service does not
//                                        plan is an error, not a local plan
//   KNAPFORMER_PLANNER_TOKEN             the job token (serve --auth=token;
//                                        knapformer token --job ID --ttl 30d)
//   KNAPFORMER_PLANNER_MESH_TLS          1/true: a service mesh encrypts the
//                                        connection, the token may go over
//                                        plaintext (mesh_tls)
//   KNAPFORMER_PLANNER_TLS_CA            PEM: TLS to the planner, verified
//                                        against this CA
//   KNAPFORMER_PLANNER_TLS_CERT, _KEY    PEM: this client's certificate and
//                                        key (mutual TLS, serve --auth=mtls)
//   KNAPFORMER_LOG_STEPS                 1/true: rank 0 logs one line per
//                                        step (PlannerClientOptions::log_steps)

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "client/planner_client.h"

namespace knapformer {

// Where a variable comes from (std::getenv by default; tests pass a map).
using Getenv = std::function<const char*(const char*)>;

// Overrides the fields whose variables are set. InvalidArgument naming the
// variable when one is malformed; nothing is changed then.
absl::Status ApplyClientEnvironment(PlannerClientOptions* planner, std::string* job_id,
                                    std::string* group_id, const Getenv& getenv = nullptr);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_ENVIRONMENT_H_
