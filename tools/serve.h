#ifndef KNAPFORMER_TOOLS_SERVE_H_
#define KNAPFORMER_TOOLS_SERVE_H_

#include <string>
#include <vector>

namespace knapformer {

// `knapformer serve`: runs the planner (flags: server/serve_flags.h) until
// SIGTERM or SIGINT, then shuts down (pending ranks get UNAVAILABLE) and
// returns 0. 2 for bad flags, 1 when it cannot start.
int RunServe(const std::vector<std::string>& argv);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_SERVE_H_
