#include "tools/serve.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/args.h"
#include "server/serve_flags.h"
#include "common/malloc_policy.h"

namespace knapformer {

int RunServe(const std::vector<std::string>& argv) {
  if (Args::WantsHelp(argv)) {
    std::cout << ServeUsage();
    return 0;
  }
  absl::StatusOr<ServeConfig> config = ParseServeArgs(argv);
  if (!config.ok()) {
    std::cerr << "knapformer serve: " << config.status().message() << "\n";
    return 2;
  }
  SetLogLevel(config->log_level);
  // Debian's abseil is built with deadlock detection, which checks every
  // absl::Mutex acquisition (gRPC's included) for lock-order cycles: ~5% of
  // the server's CPU under load. A process-wide choice, so it is made here
  // and not in the embeddable server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (config->retain_freed_memory) {
    if (absl::Status retained = RetainFreedMemory(); !retained.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("--retain-freed-memory: ", retained.message()));
    }
  }

  // Block the stop signals in every thread (gRPC's inherit this mask) so that
  // only sigwait below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(config->server);
  if (!server.ok()) {
    std::cerr << "knapformer serve: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!config->port_file.empty()) {
    // Written whole under a temporary name, then renamed: a reader never sees
    // half a line.
    const std::string temporary = config->port_file + ".tmp";
    {
      std::ofstream out(temporary);
      out << (*server)->port() << " " << (*server)->metrics_port();
      if ((*server)->health_port() != 0) out << " " << (*server)->health_port();
      out << "\n";
    }
    if (std::rename(temporary.c_str(), config->port_file.c_str()) != 0) {
      std::cerr << "knapformer serve: --port-file: cannot write '" << config->port_file << "'\n";
      return 1;
    }
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  Log(LogLevel::kInfo, absl::StrCat("received signal ", signal_number, ", shutting down"));
  (*server)->Shutdown(config->shutdown_grace);
  return 0;
}

}  // namespace knapformer
