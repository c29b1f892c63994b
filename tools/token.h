#ifndef KNAPFORMER_TOOLS_TOKEN_H_
#define KNAPFORMER_TOOLS_TOKEN_H_

#include <string>
#include <vector>

namespace knapformer {

// `knapformer token --job ID | --prefix P/ --ttl DURATION --key-file FILE`:
// prints the token (server/job_token.h) that a planner run with
// `--auth=token --auth-key-file FILE` accepts for job ID, or for every job id
// beginning with P/, until DURATION from now (minted under the file's first
// key), and on stderr its id (for a revocation list) and expiry. 0, or 2 for
// bad flags, an invalid job id or prefix, or an unusable key file.
std::string TokenUsage();
int RunToken(const std::vector<std::string>& argv);

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_TOKEN_H_
