#ifndef KNAPFORMER_CLIENT_PLANNER_TARGET_H_
#define KNAPFORMER_CLIENT_PLANNER_TARGET_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace knapformer {

// How many planner replicas a gRPC target names, as far as the client can
// tell before connecting. Targets use gRPC's own syntax:
//   host:port, dns:///host:port, dns://server/host:port  the addresses the
//       name resolves to now (one query; a name that does not resolve, yet,
//       counts 1), counted per family, the larger count (a dual-stack host
//       with an IPv4 and an IPv6 address is one planner), and addresses
//       that are all loopback count once;
//   ipv4:a:p,b:q and ipv6:[a]:p,[b]:q  the listed addresses, distinct;
//   unix:path, unix-abstract:name, anything else  1 (one endpoint, or a
//       resolver this client does not know: gRPC decides).
// Per-rank mode needs every rank of a step to reach the same replica (the
// ranks meet in its memory), so it refuses a target naming more than one.
int PlannerTargetReplicas(const std::string& target);

// InvalidArgument, naming the forms a planner address takes, for a target
// that can never reach one: a URL of a scheme gRPC does not resolve
// (http://, https://, grpc://), a host without a port (gRPC would try 443),
// a port that is not a number in 1..65535, an empty host or path, a bare
// IPv6 address without brackets. A name that does not resolve (yet) is not
// refused: it may later, and the client plans locally meanwhile.
absl::Status CheckPlannerTarget(const std::string& target);

// Whether every address `target` names stays on this machine: a unix
// socket, or loopback hosts (localhost, 127.0.0.0/8, ::1) by name, in a
// dns: target or in an ipv4:/ipv6: list. Other names are not, whatever they
// resolve to now. Where a job token may go without TLS.
bool PlannerTargetIsLocal(const std::string& target);

// How many planners a resolved name's numeric addresses are: the larger of
// its distinct IPv4 and IPv6 counts (a dual-stack host is one), 1 when all
// are loopback, and at least 1.
int PlannerAddressReplicas(const std::vector<std::string>& addresses);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_TARGET_H_
