#ifndef KNAPFORMER_COMMON_EMBEDDED_SERVICE_H_
#define KNAPFORMER_COMMON_EMBEDDED_SERVICE_H_

// The planner service hosted inside another process (the Python package's
// PlannerServer, in a trainer's rank 0), as its host sees it. Declared here
// so that the host includes nothing of server/: server/embedded_planner.cc
// defines the service and registers its start at load time, in the same
// shared object (the Python extension is built from one source list).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace knapformer {

class EmbeddedService {
 public:
  virtual ~EmbeddedService() = default;  // shuts down with the configured grace if not done yet
  virtual std::string address() const = 0;
  virtual int port() const = 0;
  virtual int metrics_port() const = 0;
  // Stops serving; `grace` defaults to the configured one. Returns when stopped.
  virtual void Shutdown(std::optional<absl::Duration> grace = std::nullopt) = 0;
};

using EmbeddedServiceStart =
    absl::StatusOr<std::unique_ptr<EmbeddedService>> (*)(const std::vector<std::string>& flags);

// The registered start: the planner's, once server/embedded_planner.cc is
// linked in (its static initialiser registers it).
inline EmbeddedServiceStart& RegisteredEmbeddedPlannerStart() {
  static EmbeddedServiceStart start = nullptr;
  return start;
}

inline bool RegisterEmbeddedPlanner(EmbeddedServiceStart start) {
  RegisteredEmbeddedPlannerStart() = start;
  return true;
}

// Starts the planner service with `knapformer serve`'s flags;
// FailedPrecondition if this binary was built without it.
inline absl::StatusOr<std::unique_ptr<EmbeddedService>> StartEmbeddedPlanner(
    const std::vector<std::string>& flags) {
  EmbeddedServiceStart start = RegisteredEmbeddedPlannerStart();
  if (start == nullptr) {
    return absl::FailedPreconditionError(
        "the planner service is not linked into this binary (server/embedded_planner.cc)");
  }
  return start(flags);
}

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_EMBEDDED_SERVICE_H_
