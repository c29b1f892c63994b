#ifndef KNAPFORMER_COMMON_LOOPBACK_H_
#define KNAPFORMER_COMMON_LOOPBACK_H_

// Whether an address stays on this machine: where a bearer token may cross
// in clear (the planner's listener, a client's target).

#include "absl/strings/string_view.h"

namespace knapformer {

// "localhost", an IPv4 address in 127.0.0.0/8, or ::1 (IPv6 in brackets or
// not, and its IPv4-mapped ::ffff:127.x.y.z). Not "", 0.0.0.0 or :: (every
// interface), nor any other name (what it resolves to can change).
bool IsLoopbackHost(absl::string_view host);

// A gRPC address ("host:port", "[v6]:port", "unix:PATH", "unix-abstract:N")
// that only this machine reaches: a loopback host or a unix socket.
bool IsLocalAddress(absl::string_view address);

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_LOOPBACK_H_
