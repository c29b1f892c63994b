#include "tools/serve.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "planner/status_macros.h"
#include "tools/args.h"
#include "tools/malloc_policy.h"

namespace knapformer {

const char kServeUsage[] =
    "  serve     [--listen 127.0.0.1:50051] [--metrics 127.0.0.1:9464 | --metrics off]\n"
    "            [--rendezvous-timeout-ms 60000] [--job-ttl-s 3600]\n"
    "            [--max-world-size 16384] [--max-sequences-per-rank 65536]\n"
    "            [--max-sequences-per-step 4194304] [--max-pending-steps 1024]\n"
    "            [--max-pending-steps-per-job 256] [--max-jobs 256] [--max-groups-per-job 1024]\n"
    "            [--max-message-bytes 67108864] [--remembered-steps 64]\n"
    "            [--timed-steps 8] [--timing-window 4096] [--min-timing-samples 16]\n"
    "            [--refine-rounds 256] [--locality on|off] [--solver-threads 0 (= cores)]\n"
    "            [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]\n"
    "            [--log-level info] [--shutdown-grace-ms 5000] [--port-file FILE]\n"
    "            [--retain-freed-memory on|off]  (on: malloc keeps freed memory\n"
    "                                              for the next plan)\n"
    "            [--answer-delay-file FILE]  (fault injection for tests: while FILE\n"
    "                                        holds N, answers wait N ms)\n"
    "            Run the gRPC planner service (knapformer.v1.Planner, health,\n"
    "            reflection) and its Prometheus metrics until SIGTERM.\n";

namespace {

// The whole milliseconds `path` holds, capped at an hour; zero while it is
// missing, empty or not a number (a test writes it while the server reads).
absl::Duration DelayInFile(const std::string& path) {
  std::ifstream in(path);
  int64_t ms = 0;
  if (!(in >> ms) || ms <= 0) return absl::ZeroDuration();
  return std::min(absl::Milliseconds(ms), absl::Hours(1));
}

}  // namespace

absl::StatusOr<ServeConfig> ParseServeArgs(const std::vector<std::string>& argv) {
  KF_ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv, {"listen", "metrics", "rendezvous-timeout-ms", "job-ttl-s",
                         "max-world-size", "max-sequences-per-rank", "max-sequences-per-step",
                         "max-pending-steps", "max-pending-steps-per-job", "max-jobs",
                         "max-groups-per-job",
                         "max-message-bytes", "remembered-steps", "refine-rounds", "locality",
                         "timed-steps", "timing-window", "min-timing-samples",
                         "solver-threads", "tls-cert", "tls-key", "tls-client-ca",
                         "log-level", "shutdown-grace-ms", "port-file", "answer-delay-file",
                         "retain-freed-memory"}));
  ServeConfig config;
  PlannerServerOptions& server = config.server;
  ServiceLimits& limits = server.service.limits;
  constexpr int64_t kInt32Max = 2147483647;
  server.listen_address = args.GetString("listen", "127.0.0.1:50051");
  server.metrics_address = args.GetString("metrics", "127.0.0.1:9464");
  if (server.metrics_address == "off") server.metrics_address.clear();

  KF_ASSIGN_OR_RETURN(int64_t timeout_ms,
                      args.GetInt("rendezvous-timeout-ms", 60000, 1, 24LL * 3600 * 1000));
  limits.rendezvous_timeout = absl::Milliseconds(timeout_ms);
  KF_ASSIGN_OR_RETURN(int64_t ttl_s, args.GetInt("job-ttl-s", 3600, 1, 30LL * 24 * 3600));
  limits.job_ttl = absl::Seconds(ttl_s);
  KF_ASSIGN_OR_RETURN(limits.max_world_size,
                      args.GetInt("max-world-size", limits.max_world_size, 1,
                                  Topology::kMaxGroupSize));
  KF_ASSIGN_OR_RETURN(limits.max_sequences_per_rank,
                      args.GetInt("max-sequences-per-rank", limits.max_sequences_per_rank, 0,
                                  int64_t{1} << 24));
  KF_ASSIGN_OR_RETURN(limits.max_sequences_per_step,
                      args.GetInt("max-sequences-per-step", limits.max_sequences_per_step, 0,
                                  BalancerLimits().max_sequences));
  KF_ASSIGN_OR_RETURN(limits.max_pending_steps,
                      args.GetInt("max-pending-steps", limits.max_pending_steps, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_pending_steps_per_job,
                      args.GetInt("max-pending-steps-per-job", limits.max_pending_steps_per_job,
                                  1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_jobs, args.GetInt("max-jobs", limits.max_jobs, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_groups_per_job,
                      args.GetInt("max-groups-per-job", limits.max_groups_per_job, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_message_bytes,
                      args.GetInt("max-message-bytes", limits.max_message_bytes, 1024,
                                  kInt32Max));
  KF_ASSIGN_OR_RETURN(limits.remembered_steps,
                      args.GetInt("remembered-steps", limits.remembered_steps, 0, 1 << 16));
  KF_ASSIGN_OR_RETURN(limits.timed_steps, args.GetInt("timed-steps", limits.timed_steps, 0, 1024));
  KF_ASSIGN_OR_RETURN(limits.timing_window,
                      args.GetInt("timing-window", limits.timing_window, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.min_timing_samples,
                      args.GetInt("min-timing-samples", limits.min_timing_samples, 2, 1 << 20));
  KF_ASSIGN_OR_RETURN(server.service.balancer.refine_rounds,
                      args.GetInt("refine-rounds", server.service.balancer.refine_rounds, 0,
                                  1 << 20));
  KF_ASSIGN_OR_RETURN(server.service.balancer.locality,
                      args.GetOnOff("locality", server.service.balancer.locality));
  KF_ASSIGN_OR_RETURN(server.service.solver_threads, args.GetInt("solver-threads", 0, 0, 1024));
  server.tls.cert_file = args.GetString("tls-cert", "");
  server.tls.key_file = args.GetString("tls-key", "");
  server.tls.client_ca_file = args.GetString("tls-client-ca", "");
  KF_ASSIGN_OR_RETURN(config.log_level, ParseLogLevel(args.GetString("log-level", "info")));
  KF_ASSIGN_OR_RETURN(int64_t grace_ms, args.GetInt("shutdown-grace-ms", 5000, 0, 600000));
  config.shutdown_grace = absl::Milliseconds(grace_ms);
  config.port_file = args.GetString("port-file", "");
  if (std::string path = args.GetString("answer-delay-file", ""); !path.empty()) {
    server.service.answer_delay = [path] { return DelayInFile(path); };
  }
  KF_ASSIGN_OR_RETURN(config.retain_freed_memory,
                      args.GetOnOff("retain-freed-memory", config.retain_freed_memory));
  return config;
}

int RunServe(const std::vector<std::string>& argv) {
  absl::StatusOr<ServeConfig> config = ParseServeArgs(argv);
  if (!config.ok()) {
    std::cerr << "knapformer: " << config.status().message() << "\n";
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
    std::cerr << "knapformer: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!config->port_file.empty()) {
    // Written whole under a temporary name, then renamed: a reader never sees
    // half a line.
    const std::string temporary = config->port_file + ".tmp";
    {
      std::ofstream out(temporary);
      out << (*server)->port() << " " << (*server)->metrics_port() << "\n";
    }
    if (std::rename(temporary.c_str(), config->port_file.c_str()) != 0) {
      std::cerr << "knapformer: --port-file: cannot write '" << config->port_file << "'\n";
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
