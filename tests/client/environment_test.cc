// The trainer-side environment variables.
#include "client/environment.h"

#include <map>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

Getenv From(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(ClientEnvironment, SetVariablesOverrideAndUnsetOnesLeaveDefaults) {
  PlannerClientOptions planner;
  std::string job = "default", group;
  ASSERT_TRUE(ApplyClientEnvironment(&planner, &job, &group,
                                     From({{"KNAPFORMER_PLANNER_ADDRESS", "planner:50051"},
                                           {"KNAPFORMER_JOB_ID", "train-7"},
                                           {"KNAPFORMER_PLANNER_DEADLINE_SECONDS", "2.5"}}))
                  .ok());
  EXPECT_EQ(planner.address, "planner:50051");
  EXPECT_EQ(job, "train-7");
  EXPECT_EQ(group, "");
  EXPECT_EQ(planner.call_deadline, absl::Milliseconds(2500));
  EXPECT_EQ(planner.max_attempts, PlannerClientOptions().max_attempts);

  // An empty address means: plan locally.
  ASSERT_TRUE(
      ApplyClientEnvironment(&planner, &job, &group, From({{"KNAPFORMER_PLANNER_ADDRESS", ""}}))
          .ok());
  EXPECT_EQ(planner.address, "");
}

TEST(ClientEnvironment, MalformedVariablesAreErrorsNamingThemAndChangeNothing) {
  PlannerClientOptions planner;
  std::string job = "default", group = "g";
  for (const char* bad : {"0", "-1", "soon", "1e9"}) {
    absl::Status status = ApplyClientEnvironment(
        &planner, &job, &group,
        From({{"KNAPFORMER_PLANNER_DEADLINE_SECONDS", bad}, {"KNAPFORMER_JOB_ID", "x"}}));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(status.message().substr(0, 36), "KNAPFORMER_PLANNER_DEADLINE_SECONDS:") << bad;
  }
  EXPECT_EQ(job, "default");
  EXPECT_EQ(planner.call_deadline, PlannerClientOptions().call_deadline);
  EXPECT_EQ(ApplyClientEnvironment(&planner, &job, &group, From({{"KNAPFORMER_JOB_ID", ""}}))
                .message(),
            "KNAPFORMER_JOB_ID: set but empty");
}

TEST(ClientEnvironment, CredentialsComeFromTheirVariables) {
  PlannerClientOptions planner;
  std::string job = "default", group;
  ASSERT_TRUE(ApplyClientEnvironment(&planner, &job, &group,
                                     From({{"KNAPFORMER_PLANNER_TOKEN", "kf1.abc"},
                                           {"KNAPFORMER_PLANNER_TLS_CA", "/etc/ca.pem"},
                                           {"KNAPFORMER_PLANNER_TLS_CERT", "/etc/rank.pem"},
                                           {"KNAPFORMER_PLANNER_TLS_KEY", "/etc/rank.key"}}))
                  .ok());
  EXPECT_EQ(planner.token, "kf1.abc");
  EXPECT_EQ(planner.tls.ca_file, "/etc/ca.pem");
  EXPECT_EQ(planner.tls.cert_file, "/etc/rank.pem");
  EXPECT_EQ(planner.tls.key_file, "/etc/rank.key");
  // A token with a line break could add headers of its own.
  const absl::Status bad = ApplyClientEnvironment(
      &planner, &job, &group, From({{"KNAPFORMER_PLANNER_TOKEN", "kf1.abc\r\nx-admin: 1"}}));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("KNAPFORMER_PLANNER_TOKEN: planner_token: character 7"),
            std::string::npos)
      << bad;
  EXPECT_EQ(planner.token, "kf1.abc");  // unchanged
}

TEST(ClientEnvironment, RequirePlannerIsOneOfFourWords) {
  PlannerClientOptions planner;
  std::string job = "default", group;
  for (const auto& [text, expected] : std::map<std::string, bool>{
           {"1", true}, {"true", true}, {"0", false}, {"false", false}, {"", false}}) {
    planner.require_service = !expected;
    ASSERT_TRUE(ApplyClientEnvironment(&planner, &job, &group,
                                       From({{"KNAPFORMER_REQUIRE_PLANNER", text}}))
                    .ok())
        << text;
    EXPECT_EQ(planner.require_service, expected) << text;
  }
  planner.require_service = false;
  absl::Status status = ApplyClientEnvironment(&planner, &job, &group,
                                               From({{"KNAPFORMER_REQUIRE_PLANNER", "yes"}}));
  EXPECT_EQ(status.message(), "KNAPFORMER_REQUIRE_PLANNER: 'yes' is not one of 1, true, 0, false");
  EXPECT_FALSE(planner.require_service);
}

TEST(ClientEnvironment, LogStepsIsOneOfFourWords) {
  PlannerClientOptions planner;
  std::string job = "default", group;
  ASSERT_TRUE(
      ApplyClientEnvironment(&planner, &job, &group, From({{"KNAPFORMER_LOG_STEPS", "true"}}))
          .ok());
  EXPECT_TRUE(planner.log_steps);
  EXPECT_FALSE(planner.require_service);  // the other switch is left alone
  ASSERT_TRUE(
      ApplyClientEnvironment(&planner, &job, &group, From({{"KNAPFORMER_LOG_STEPS", "0"}})).ok());
  EXPECT_FALSE(planner.log_steps);
  const absl::Status status =
      ApplyClientEnvironment(&planner, &job, &group, From({{"KNAPFORMER_LOG_STEPS", "on"}}));
  EXPECT_EQ(status.message(), "KNAPFORMER_LOG_STEPS: 'on' is not one of 1, true, 0, false");
  // A mesh that encrypts for the client is said so by name.
  ASSERT_TRUE(ApplyClientEnvironment(&planner, &job, &group,
                                     From({{"KNAPFORMER_PLANNER_MESH_TLS", "1"}}))
                  .ok());
  EXPECT_TRUE(planner.mesh_tls);
}

}  // namespace
}  // namespace knapformer
