#include "server/serve_flags.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "common/status_macros.h"
#include "planner/balancer_options.h"

namespace knapformer {

namespace {

// The defaults that ServeConfig's members do not carry themselves.
constexpr char kDefaultMetrics[] = "127.0.0.1:9464";
constexpr char kDefaultLogLevel[] = "info";

const std::vector<OptionSpec>& ServeOptions() {
  static const std::vector<OptionSpec> kOptions = [] {
    const ServeConfig config;
    const PlannerServerOptions& server = config.server;
    const ServiceLimits& limits = server.service.limits;
    auto number = [](int64_t value) { return absl::StrCat(value); };
    return std::vector<OptionSpec>{
        {"listen", "HOST:PORT", server.listen_address, "gRPC address; port 0 picks a free one"},
        {"metrics", "HOST:PORT|off", kDefaultMetrics, "Prometheus /metrics address"},
        {"rendezvous-timeout-ms", "MS",
         number(absl::ToInt64Milliseconds(limits.rendezvous_timeout)),
         "a step waits this long for its last rank"},
        {"job-ttl-s", "S", number(absl::ToInt64Seconds(limits.job_ttl)),
         "a job idle this long is forgotten"},
        {"max-world-size", "N", number(limits.max_world_size), "ranks in one group"},
        {"max-sequences-per-rank", "N", number(limits.max_sequences_per_rank),
         "sequences in one rank's request"},
        {"max-sequences-per-step", "N", number(limits.max_sequences_per_step),
         "sequences in one step of a group"},
        {"max-mask-spans-per-step", "N", number(limits.max_mask_spans_per_step),
         "spans of attention masks in one step"},
        {"max-pending-steps", "N", number(limits.max_pending_steps),
         "steps waiting for ranks, all jobs"},
        {"max-pending-steps-per-job", "N", number(limits.max_pending_steps_per_job),
         "steps waiting for ranks, one job"},
        {"max-jobs", "N", number(limits.max_jobs), "jobs tracked at once"},
        {"max-jobs-per-tenant", "N", number(limits.max_jobs_per_tenant),
         "jobs of one tenant (a credential's scope)"},
        {"max-groups-per-job", "N", number(limits.max_groups_per_job), "groups of one job"},
        {"max-queued-solves", "N", number(limits.max_queued_solves),
         "steps waiting for a solver; beyond, refused"},
        {"max-solve-wait-ms", "MS", number(absl::ToInt64Milliseconds(limits.max_solve_wait)),
         "a step waiting longer for a solver is refused"},
        {"max-plan-group-calls", "N", number(limits.max_plan_group_calls),
         "PlanGroup calls in flight, all jobs"},
        {"max-plan-group-calls-per-tenant", "N", number(limits.max_plan_group_calls_per_tenant),
         "PlanGroup calls in flight, one tenant"},
        {"max-plan-group-calls-per-job", "N", number(limits.max_plan_group_calls_per_job),
         "PlanGroup calls in flight, one job"},
        {"max-message-bytes", "N", number(limits.max_message_bytes),
         "largest request gRPC accepts; 0 = what the limits admit"},
        {"max-request-memory", "BYTES", number(limits.max_request_memory),
         "parsed requests held, all tenants"},
        {"max-request-memory-per-tenant", "BYTES", number(limits.max_request_memory_per_tenant),
         "parsed requests held, one tenant"},
        {"max-request-memory-per-job", "BYTES", number(limits.max_request_memory_per_job),
         "parsed requests held, one job"},
        {"remembered-steps", "N", number(limits.remembered_steps),
         "answered steps remembered per group"},
        {"greedy", "RULE", GreedyRuleName(server.service.balancer.greedy),
         "the paper's rule is least-occupied"},
        {"refine-rounds", "N", number(server.service.balancer.refine_rounds),
         "local refinement rounds per plan"},
        {"locality", "on|off", OnOff(server.service.balancer.locality),
         "move as few tokens as possible at the same max/mean"},
        {"timed-steps", "N", number(limits.timed_steps),
         "steps per group kept to pair with timings (gamma fit)"},
        {"timing-window", "N", number(limits.timing_window), "timing samples kept per job"},
        {"min-timing-samples", "N", number(limits.min_timing_samples),
         "samples a gamma fit needs"},
        {"solver-threads", "N", number(server.service.solver_threads),
         "solver threads; 0 = the CPUs it may use (quota)"},
        {"tls-cert", "PEM", "", "the server's certificate chain (TLS; with --tls-key)"},
        {"tls-key", "PEM", "", "its private key"},
        {"tls-client-ca", "PEM", "", "require client certificates signed by this CA"},
        {"auth", "MODE", "none", "who may act as a job: none, token or mtls"},
        {"health-listen", "ADDR", "", "plaintext health-only listener (kubelet probes of TLS)"},
        {"auth-key-file", "FILE", "", "--auth=token: keys, one per line; reread on change"},
        {"auth-revoked-file", "FILE", "", "--auth=token: revoked token ids; reread on change"},
        {"mtls-trust-domain", "DOMAIN", "",
         "--auth=mtls: spiffe://DOMAIN/ns/NS/... acts as jobs NS/..."},
        {"mtls-job-names", "on|off", "off",
         "--auth=mtls: a SAN equal to a job id names it"},
        {"mesh-tls", "on|off", "off",
         "a mesh encrypts connections: --auth without TLS"},
        {"log-level", "LEVEL", kDefaultLogLevel, "debug, info, warning or error"},
        {"shutdown-grace-ms", "MS", number(absl::ToInt64Milliseconds(config.shutdown_grace)),
         "after SIGTERM, pending ranks get this long"},
        {"max-connection-age-ms", "MS", number(absl::ToInt64Milliseconds(server.max_connection_age)),
         "reconnect clients (re-resolve); 0 = never"},
        {"port-file", "FILE", "", "write \"<grpc port> <metrics port>\" once serving"},
        {"retain-freed-memory", "on|off", OnOff(config.retain_freed_memory),
         "malloc keeps freed memory for the next plan"},
        {"answer-delay-file", "FILE", "",
         "fault injection for tests: while FILE holds N, answers wait N ms"},
    };
  }();
  return kOptions;
}

}  // namespace

std::string ServeUsage() {
  return FormatUsage("knapformer serve [options]",
                     "Run the gRPC planner service (knapformer.v1.Planner, health, reflection)\n"
                     "and its Prometheus metrics until SIGTERM or SIGINT (docs/service.md).",
                     ServeOptions());
}

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
  KF_ASSIGN_OR_RETURN(Args args, Args::ParseOptions(argv, ServeOptions()));
  ServeConfig config;
  PlannerServerOptions& server = config.server;
  ServiceLimits& limits = server.service.limits;
  constexpr int64_t kInt32Max = 2147483647;
  server.listen_address = args.GetString("listen", server.listen_address);
  server.metrics_address = args.GetString("metrics", kDefaultMetrics);
  if (server.metrics_address == "off") server.metrics_address.clear();

  KF_ASSIGN_OR_RETURN(int64_t timeout_ms,
                      args.GetInt("rendezvous-timeout-ms",
                                  absl::ToInt64Milliseconds(limits.rendezvous_timeout), 1,
                                  24LL * 3600 * 1000));
  limits.rendezvous_timeout = absl::Milliseconds(timeout_ms);
  KF_ASSIGN_OR_RETURN(int64_t ttl_s, args.GetInt("job-ttl-s", absl::ToInt64Seconds(limits.job_ttl),
                                                 1, 30LL * 24 * 3600));
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
  KF_ASSIGN_OR_RETURN(limits.max_mask_spans_per_step,
                      args.GetInt("max-mask-spans-per-step", limits.max_mask_spans_per_step, 0,
                                  int64_t{1} << 28));
  KF_ASSIGN_OR_RETURN(limits.max_pending_steps,
                      args.GetInt("max-pending-steps", limits.max_pending_steps, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_pending_steps_per_job,
                      args.GetInt("max-pending-steps-per-job", limits.max_pending_steps_per_job,
                                  1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_jobs, args.GetInt("max-jobs", limits.max_jobs, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_jobs_per_tenant,
                      args.GetInt("max-jobs-per-tenant", limits.max_jobs_per_tenant, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_groups_per_job,
                      args.GetInt("max-groups-per-job", limits.max_groups_per_job, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_queued_solves,
                      args.GetInt("max-queued-solves", limits.max_queued_solves, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(int64_t solve_wait_ms,
                      args.GetInt("max-solve-wait-ms",
                                  absl::ToInt64Milliseconds(limits.max_solve_wait), 1,
                                  24LL * 3600 * 1000));
  limits.max_solve_wait = absl::Milliseconds(solve_wait_ms);
  KF_ASSIGN_OR_RETURN(limits.max_plan_group_calls,
                      args.GetInt("max-plan-group-calls", limits.max_plan_group_calls, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_plan_group_calls_per_tenant,
                      args.GetInt("max-plan-group-calls-per-tenant",
                                  limits.max_plan_group_calls_per_tenant, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(
      limits.max_plan_group_calls_per_job,
      args.GetInt("max-plan-group-calls-per-job", limits.max_plan_group_calls_per_job, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.max_message_bytes,
                      args.GetInt("max-message-bytes", limits.max_message_bytes, 0, kInt32Max));
  if (limits.max_message_bytes > 0 && limits.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-message-bytes: ", limits.max_message_bytes,
        " is too small for any request; give 0 (what the limits admit) or at least 1024"));
  }
  KF_ASSIGN_OR_RETURN(limits.max_request_memory,
                      args.GetInt("max-request-memory", limits.max_request_memory, 1 << 20,
                                  int64_t{1} << 40));
  KF_ASSIGN_OR_RETURN(limits.max_request_memory_per_tenant,
                      args.GetInt("max-request-memory-per-tenant",
                                  limits.max_request_memory_per_tenant, 1 << 20,
                                  int64_t{1} << 40));
  KF_ASSIGN_OR_RETURN(limits.max_request_memory_per_job,
                      args.GetInt("max-request-memory-per-job", limits.max_request_memory_per_job,
                                  1 << 20, int64_t{1} << 40));
  KF_ASSIGN_OR_RETURN(limits.remembered_steps,
                      args.GetInt("remembered-steps", limits.remembered_steps, 0, 1 << 16));
  KF_ASSIGN_OR_RETURN(limits.timed_steps, args.GetInt("timed-steps", limits.timed_steps, 0, 1024));
  KF_ASSIGN_OR_RETURN(limits.timing_window,
                      args.GetInt("timing-window", limits.timing_window, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(limits.min_timing_samples,
                      args.GetInt("min-timing-samples", limits.min_timing_samples, 2, 1 << 20));
  KF_ASSIGN_OR_RETURN(
      server.service.balancer.greedy,
      ParseGreedyRule(args.GetString("greedy", GreedyRuleName(server.service.balancer.greedy)),
                      "--greedy"));
  KF_ASSIGN_OR_RETURN(server.service.balancer.refine_rounds,
                      args.GetInt("refine-rounds", server.service.balancer.refine_rounds, 0,
                                  1 << 20));
  KF_ASSIGN_OR_RETURN(server.service.balancer.locality,
                      args.GetOnOff("locality", server.service.balancer.locality));
  KF_ASSIGN_OR_RETURN(server.service.solver_threads, args.GetInt("solver-threads", 0, 0, 1024));
  server.tls.cert_file = args.GetString("tls-cert", "");
  server.tls.key_file = args.GetString("tls-key", "");
  server.tls.client_ca_file = args.GetString("tls-client-ca", "");
  KF_ASSIGN_OR_RETURN(server.auth.mode, ParseAuthMode(args.GetString("auth", "none")));
  server.auth.key_file = args.GetString("auth-key-file", "");
  server.auth.revoked_file = args.GetString("auth-revoked-file", "");
  server.auth.mtls_trust_domain = args.GetString("mtls-trust-domain", "");
  KF_ASSIGN_OR_RETURN(server.auth.mtls_job_names, args.GetOnOff("mtls-job-names", false));
  KF_ASSIGN_OR_RETURN(server.mesh_tls, args.GetOnOff("mesh-tls", false));
  server.health_address = args.GetString("health-listen", "");
  KF_ASSIGN_OR_RETURN(config.log_level,
                      ParseLogLevel(args.GetString("log-level", kDefaultLogLevel)));
  KF_ASSIGN_OR_RETURN(int64_t grace_ms,
                      args.GetInt("shutdown-grace-ms",
                                  absl::ToInt64Milliseconds(config.shutdown_grace), 0, 600000));
  config.shutdown_grace = absl::Milliseconds(grace_ms);
  KF_ASSIGN_OR_RETURN(
      int64_t age_ms,
      args.GetInt("max-connection-age-ms", absl::ToInt64Milliseconds(server.max_connection_age), 0,
                  std::numeric_limits<int>::max()));
  server.max_connection_age = absl::Milliseconds(age_ms);
  config.port_file = args.GetString("port-file", "");
  if (std::string path = args.GetString("answer-delay-file", ""); !path.empty()) {
    server.service.answer_delay = [path] { return DelayInFile(path); };
  }
  KF_ASSIGN_OR_RETURN(config.retain_freed_memory,
                      args.GetOnOff("retain-freed-memory", config.retain_freed_memory));
  return config;
}

}  // namespace knapformer
