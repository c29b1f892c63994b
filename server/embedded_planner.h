#ifndef KNAPFORMER_SERVER_EMBEDDED_PLANNER_H_
#define KNAPFORMER_SERVER_EMBEDDED_PLANNER_H_

// The planner service inside another process (a trainer's rank 0, the Python
// package's PlannerServer), configured with `knapformer serve`'s flags less
// the two that act on a whole process of its own (--port-file,
// --retain-freed-memory). Its host sees it as an EmbeddedService
// (common/embedded_service.h), started by StartEmbeddedPlanner.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/embedded_service.h"

namespace knapformer {

class PlannerServer;

class EmbeddedPlanner : public EmbeddedService {
 public:
  // Parses `flags` as ParseServeArgs does (InvalidArgument naming the flag),
  // applies --log-level and starts serving (Unavailable for a taken port).
  static absl::StatusOr<std::unique_ptr<EmbeddedPlanner>> Start(
      const std::vector<std::string>& flags);
  ~EmbeddedPlanner() override;  // Shutdown() with the configured grace if not done yet

  std::string address() const override;
  int port() const override;
  int metrics_port() const override;

  // Stops serving: waiting ranks get UNAVAILABLE, answers being sent get
  // `grace` (default: --shutdown-grace-ms). Returns when stopped.
  void Shutdown(std::optional<absl::Duration> grace = std::nullopt) override;

 private:
  EmbeddedPlanner(std::unique_ptr<PlannerServer> server, absl::Duration shutdown_grace);

  std::unique_ptr<PlannerServer> server_;
  absl::Duration shutdown_grace_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_EMBEDDED_PLANNER_H_
