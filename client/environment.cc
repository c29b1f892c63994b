#include "client/environment.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/planner_credentials.h"

namespace knapformer {

absl::Status ApplyClientEnvironment(PlannerClientOptions* planner, std::string* job_id,
                                    std::string* group_id, const Getenv& getenv) {
  const Getenv get = getenv ? getenv : [](const char* name) { return std::getenv(name); };
  PlannerClientOptions new_planner = *planner;
  std::string new_job = *job_id, new_group = *group_id;
  if (const char* address = get("KNAPFORMER_PLANNER_ADDRESS")) new_planner.address = address;
  if (const char* job = get("KNAPFORMER_JOB_ID")) {
    if (*job == '\0') return absl::InvalidArgumentError("KNAPFORMER_JOB_ID: set but empty");
    new_job = job;
  }
  if (const char* group = get("KNAPFORMER_GROUP_ID")) new_group = group;
  for (auto [name, field] : {std::pair{"KNAPFORMER_REQUIRE_PLANNER", &new_planner.require_service},
                             std::pair{"KNAPFORMER_LOG_STEPS", &new_planner.log_steps},
                             std::pair{"KNAPFORMER_PLANNER_MESH_TLS", &new_planner.mesh_tls}}) {
    const char* text = get(name);
    if (text == nullptr) continue;
    const std::string value = text;
    if (value == "1" || value == "true") {
      *field = true;
    } else if (value == "0" || value == "false" || value.empty()) {
      *field = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": '", value, "' is not one of 1, true, 0, false"));
    }
  }
  if (const char* text = get("KNAPFORMER_PLANNER_DEADLINE_SECONDS")) {
    double seconds = 0;
    if (!absl::SimpleAtod(text, &seconds) || !(seconds > 0) || seconds > 86400) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KNAPFORMER_PLANNER_DEADLINE_SECONDS: '", text, "' is not a number of seconds in (0, 86400]"));
    }
    new_planner.call_deadline = absl::Seconds(seconds);
  }
  if (const char* token = get("KNAPFORMER_PLANNER_TOKEN")) {
    new_planner.token = token;
    if (absl::Status valid = CheckPlannerToken(new_planner.token); !valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("KNAPFORMER_PLANNER_TOKEN: ", valid.message()));
    }
  }
  if (const char* path = get("KNAPFORMER_PLANNER_TLS_CA")) new_planner.tls.ca_file = path;
  if (const char* path = get("KNAPFORMER_PLANNER_TLS_CERT")) new_planner.tls.cert_file = path;
  if (const char* path = get("KNAPFORMER_PLANNER_TLS_KEY")) new_planner.tls.key_file = path;
  *planner = std::move(new_planner);
  *job_id = std::move(new_job);
  *group_id = std::move(new_group);
  return absl::OkStatus();
}

}  // namespace knapformer
