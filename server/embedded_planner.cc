#include "server/embedded_planner.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/planner_server.h"
#include "server/serve_flags.h"

namespace knapformer {
namespace {

// Flags of `knapformer serve` that act on the whole process or only make
// sense for a process of its own.
constexpr const char* kProcessFlags[] = {"--port-file", "--retain-freed-memory"};

absl::StatusOr<std::unique_ptr<EmbeddedService>> StartAsService(
    const std::vector<std::string>& flags) {
  absl::StatusOr<std::unique_ptr<EmbeddedPlanner>> planner = EmbeddedPlanner::Start(flags);
  if (!planner.ok()) return planner.status();
  return std::unique_ptr<EmbeddedService>(*std::move(planner));
}

// What StartEmbeddedPlanner starts wherever this file is linked in.
const bool kRegistered = RegisterEmbeddedPlanner(&StartAsService);

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedPlanner>> EmbeddedPlanner::Start(
    const std::vector<std::string>& flags) {
  for (const std::string& flag : flags) {
    for (const char* process_flag : kProcessFlags) {
      if (absl::StartsWith(flag, process_flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            process_flag + 2,
            ": a setting of the `knapformer serve` process; an embedded server does not take it"));
      }
    }
  }
  absl::StatusOr<ServeConfig> config = ParseServeArgs(flags);
  if (!config.ok()) return config.status();
  SetLogLevel(config->log_level);
  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(config->server);
  if (!server.ok()) return server.status();
  return std::unique_ptr<EmbeddedPlanner>(
      new EmbeddedPlanner(*std::move(server), config->shutdown_grace));
}

EmbeddedPlanner::EmbeddedPlanner(std::unique_ptr<PlannerServer> server,
                                 absl::Duration shutdown_grace)
    : server_(std::move(server)), shutdown_grace_(shutdown_grace) {}

EmbeddedPlanner::~EmbeddedPlanner() { Shutdown(); }

std::string EmbeddedPlanner::address() const { return server_->address(); }
int EmbeddedPlanner::port() const { return server_->port(); }
int EmbeddedPlanner::metrics_port() const { return server_->metrics_port(); }

void EmbeddedPlanner::Shutdown(std::optional<absl::Duration> grace) {
  server_->Shutdown(grace.value_or(shutdown_grace_));
}

}  // namespace knapformer
