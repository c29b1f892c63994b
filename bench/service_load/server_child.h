#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_SERVER_CHILD_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_SERVER_CHILD_H_

// The server under load, in a child process forked before this process
// creates any gRPC object (so that its CPU time is its own in /proc): the
// planner server, or the bare rendezvous it is measured against. The child
// tells its port through one pipe and stops when the other is closed (or
// this process dies); launch/child_process.h keeps every wait for it
// bounded and reaps it, killed if need be, on every way out.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "launch/child_process.h"

namespace knapformer {
namespace service_load {

enum class ServerKind { kPlanner, kBareRendezvous };

class ServerProcess {
 public:
  explicit ServerProcess(ServerKind kind) : kind_(kind) {}
  ~ServerProcess() { Stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Forks the child and waits (bounded) for its port. False after printing why.
  bool Start();

  pid_t pid() const { return child_.pid(); }
  int port() const { return port_; }

  // The child's /proc figures (ChildProcess's).
  int64_t RssBytes() const { return child_.RssBytes(); }
  int64_t PeakRssBytes() const { return child_.PeakRssBytes(); }
  int OpenFds() const { return child_.OpenFds(); }
  std::optional<double> CpuSeconds() const { return child_.CpuSeconds(); }

  // Empty while the child runs; how it ended once it has (reaping it).
  std::string ExitIfEnded() { return child_.ExitIfEnded(); }

  // Asks the child to stop (closes the pipe), waits up to kChildExitWaitMs,
  // then kills it. Returns how it ended. Idempotent.
  std::string Stop();

 private:
  const ServerKind kind_;
  ChildProcess child_;
  int port_ = 0;
  int stop_fd_ = -1;
};

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_SERVER_CHILD_H_
