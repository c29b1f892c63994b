#ifndef KNAPFORMER_CLIENT_PLANNER_TARGET_H_
#define KNAPFORMER_CLIENT_PLANNER_TARGET_H_

#include <string>

namespace knapformer {

// How many planner replicas a gRPC target names, as far as the client can
// tell before connecting. Targets use gRPC's own syntax:
//   host:port, dns:///host:port, dns://server/host:port  the addresses the
//       name resolves to now (one query; a name that does not resolve, yet,
//       counts 1), where addresses that are all loopback count once (so
//       "localhost" with 127.0.0.1 and ::1 is one planner);
//   ipv4:a:p,b:q and ipv6:[a]:p,[b]:q  the listed addresses, distinct;
//   unix:path, unix-abstract:name, anything else  1 (one endpoint, or a
//       resolver this client does not know: gRPC decides).
// Per-rank mode needs every rank of a step to reach the same replica (the
// ranks meet in its memory), so it refuses a target naming more than one.
int PlannerTargetReplicas(const std::string& target);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_TARGET_H_
