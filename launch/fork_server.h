#ifndef KNAPFORMER_LAUNCH_FORK_SERVER_H_
#define KNAPFORMER_LAUNCH_FORK_SERVER_H_

// Copies of this process forked from a server process made at the top of
// main, before any thread: a copy starts in the state of a process that has
// just loaded the binary and run its static initialisers, without paying
// for either again. For a binary linked with LibTorch that is most of a
// rank's cost in a short multi-process test (under ASan about a CPU second
// a copy: the loader, torch's operator registry, ASan's own start). It is
// the C++ counterpart of knapformer.launch's forkserver; LaunchLocalWorld
// uses it where a server runs, and otherwise executes the binary afresh.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace knapformer {

// Forks the server; call first in main, before anything starts a thread.
// Returns false in this process, and true in each copy the server forks
// later for ForkCopy: a copy returns from here into main, with the
// environment and output ForkCopy gave it. Makes no server (and returns
// false) where this process already runs more than one thread or the server
// cannot be made; ForkCopy then answers Unavailable.
bool StartForkServer();

// A copy from the server, with exactly the environment `env` ("NAME=value"
// entries), its stdout and stderr written to `log_path` (created or
// truncated; empty: the server's, which are this process's), and, as an
// executed copy would inherit them, the signals this process ignores and
// its calling thread's signal mask. The copy is this
// process's child (this process adopts it as a subreaper): wait for it and
// kill it as for one it spawned. Unavailable if no server runs, it has
// gone, or it did not answer within a few seconds.
absl::StatusOr<pid_t> ForkCopy(const std::vector<std::string>& env, const std::string& log_path);

}  // namespace knapformer

#endif  // KNAPFORMER_LAUNCH_FORK_SERVER_H_
