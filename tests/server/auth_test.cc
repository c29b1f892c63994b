// Who may act as which job (server/job_auth.h): the token's HMAC against
// RFC 4231, key files (errors, rotation, rereading), the mTLS naming rule,
// and a served planner that refuses a stranger's Plan, PlanGroup and GetJob
// alike whether the job exists or not, while the job's own credential works.
#include "server/job_auth.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/planner_credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner_server.h"
#include "tests/server/service_test_util.h"
#include "tests/server/test_server.h"

namespace knapformer {
namespace {

using ::knapformer::testing_util::MakeRequest;
using ::knapformer::testing_util::StartServer;
using ::knapformer::testing_util::StepParams;
using ::knapformer::testing_util::TempPath;
using ::knapformer::testing_util::TestOptions;
using ::testing::HasSubstr;

constexpr char kKeyA[] = "0123456789abcdef0123456789abcdef-key-a";
constexpr char kKeyB[] = "fedcba9876543210fedcba9876543210-key-b";

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

CallerCredentials Bearer(const std::string& token) {
  CallerCredentials caller;
  caller.has_authorization = true;
  caller.authorization_is_bearer = true;
  caller.bearer_token = token;
  return caller;
}

TEST(JobTokenTest, IsHmacSha256OfTheJobIdInHex) {
  // RFC 4231, test case 2.
  EXPECT_EQ(MintJobToken("Jefe", "what do ya want for nothing?"),
            "kf1.5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_NE(MintJobToken(kKeyA, "job-a"), MintJobToken(kKeyA, "job-b"));
  EXPECT_NE(MintJobToken(kKeyA, "job-a"), MintJobToken(kKeyB, "job-a"));
}

TEST(JobKeysTest, BadKeyFilesNameTheFileAndLine) {
  const std::string path = TempPath("keys_bad");
  WriteFile(path, absl::StrCat("# comment\n\n", kKeyA, "\nshort\n"));
  absl::StatusOr<std::vector<std::string>> keys = ReadJobKeys(path);
  ASSERT_FALSE(keys.ok());
  EXPECT_THAT(keys.status().message(), HasSubstr(path + ", line 4: a key of 5 characters"));
  WriteFile(path, "# only a comment\n");
  EXPECT_THAT(ReadJobKeys(path).status().message(), HasSubstr("no key"));
  EXPECT_EQ(ReadJobKeys(TempPath("keys_missing")).status().code(), absl::StatusCode::kNotFound);
  WriteFile(path, absl::StrCat("  ", kKeyA, "  \n", kKeyB, "\n"));
  keys = ReadJobKeys(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{kKeyA, kKeyB}));
}

TEST(JobAuthorizerTest, ModesRefuseWhatTheyLack) {
  EXPECT_THAT(JobAuthorizer::Create(AuthMode::kToken, "", false).status().message(),
              HasSubstr("--auth=token needs --auth-key-file"));
  EXPECT_THAT(JobAuthorizer::Create(AuthMode::kMtls, "", false).status().message(),
              HasSubstr("--auth=mtls needs --tls-cert, --tls-key and --tls-client-ca"));
  EXPECT_THAT(JobAuthorizer::Create(AuthMode::kNone, "/k", false).status().message(),
              HasSubstr("--auth-key-file is for --auth=token"));
  EXPECT_THAT(ParseAuthMode("tokens").status().message(),
              HasSubstr("'tokens' is not one of none, token, mtls"));
}

TEST(JobAuthorizerTest, TokensGrantTheirJobOnlyAndFollowTheKeyFile) {
  const std::string path = TempPath("keys_rotate");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  auto authorizer = JobAuthorizer::Create(AuthMode::kToken, path, false);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  EXPECT_TRUE(auth.Authorize(Bearer(MintJobToken(kKeyA, "job-a")), "job-a").ok());
  EXPECT_EQ(auth.Authorize(Bearer(MintJobToken(kKeyA, "job-b")), "job-a").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(CallerCredentials(), "job-a").code(),
            absl::StatusCode::kUnauthenticated);
  CallerCredentials basic;
  basic.has_authorization = true;
  EXPECT_EQ(auth.Authorize(basic, "job-a").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(auth.Authorize(Bearer("kf1.abc"), "job-a").code(),
            absl::StatusCode::kUnauthenticated);

  // Rotation: the new key first, the old one still verifies until removed.
  absl::SleepFor(absl::Milliseconds(1100));  // the file is looked at once a second
  WriteFile(path, absl::StrCat(kKeyB, "\n", kKeyA, "\n"));
  EXPECT_TRUE(auth.Authorize(Bearer(MintJobToken(kKeyB, "job-a")), "job-a").ok());
  EXPECT_TRUE(auth.Authorize(Bearer(MintJobToken(kKeyA, "job-a")), "job-a").ok());
  absl::SleepFor(absl::Milliseconds(1100));
  WriteFile(path, absl::StrCat(kKeyB, "\n"));
  EXPECT_EQ(auth.Authorize(Bearer(MintJobToken(kKeyA, "job-a")), "job-a").code(),
            absl::StatusCode::kPermissionDenied);
  // A file made unusable keeps the keys last read, and is warned about once,
  // not at every look.
  absl::SleepFor(absl::Milliseconds(1100));
  WriteFile(path, "short\n");
  ::testing::internal::CaptureStderr();
  for (int look = 0; look < 3; ++look) {
    EXPECT_TRUE(auth.Authorize(Bearer(MintJobToken(kKeyB, "job-a")), "job-a").ok());
    absl::SleepFor(absl::Milliseconds(1100));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("keeping the keys last read"); at != std::string::npos;
       at = log.find("keeping the keys last read", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
}

TEST(JobAuthorizerTest, APrefixTokenGrantsTheJobsUnderItsPrefixOnly) {
  const std::string path = TempPath("keys_prefix");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  auto authorizer = JobAuthorizer::Create(AuthMode::kToken, path, false);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  const std::string team = MintJobPrefixToken(kKeyA, "team-a/");
  EXPECT_EQ(team, MintJobToken(kKeyA, "team-a/") + ".team-a/");
  EXPECT_TRUE(auth.Authorize(Bearer(team), "team-a/train/123").ok());
  EXPECT_EQ(auth.Authorize(Bearer(team), "team-b/train/123").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(Bearer(team), "team-a").code(), absl::StatusCode::kPermissionDenied);
  // The prefix is what the MAC covers: another prefix under the same MAC fails.
  const std::string forged = MintJobToken(kKeyA, "team-a/") + ".team-";
  EXPECT_EQ(auth.Authorize(Bearer(forged + "b/"), "team-b/x").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(Bearer(MintJobToken(kKeyA, "team-a/") + ".team-a/x/"), "team-a/x/1")
                .code(),
            absl::StatusCode::kPermissionDenied);
  // A prefix must end in "/": else it is no token at all.
  EXPECT_EQ(auth.Authorize(Bearer(MintJobToken(kKeyA, "team-a") + ".team-a"), "team-a/x").code(),
            absl::StatusCode::kUnauthenticated);
  // A job token never grants more than its job.
  EXPECT_EQ(auth.Authorize(Bearer(MintJobToken(kKeyA, "team-a/")), "team-a/x").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(JobAuthorizerTest, CertificatesNameTheirJobOrTheirNamespacesJobs) {
  auto authorizer = JobAuthorizer::Create(AuthMode::kMtls, "", true);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  CallerCredentials caller;
  caller.certificate_names = {"job-b", "spiffe://cluster.local/ns/team-a/sa/trainer"};
  JobAuthorizer& auth = **authorizer;
  EXPECT_TRUE(auth.Authorize(caller, "job-b").ok());
  EXPECT_TRUE(auth.Authorize(caller, "team-a/run-1").ok());
  EXPECT_EQ(auth.Authorize(caller, "team-b/run-1").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(caller, "team-a").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(caller, "job-bb").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(CallerCredentials(), "job-b").code(),
            absl::StatusCode::kUnauthenticated);
}

// A served planner's three job-naming calls with `metadata_token` (none
// when empty) over `channel`.
struct Calls {
  grpc::Status plan, plan_group, get_job;
};
Calls CallAs(const std::shared_ptr<grpc::Channel>& channel, const std::string& job,
             const std::string& token, uint64_t step) {
  auto stub = v1::Planner::NewStub(channel);
  auto context = [&](grpc::ClientContext* c) {
    c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  };
  StepParams params;
  params.job_id = job;
  params.topology = "g1n1";
  params.step = step;
  Calls calls;
  {
    grpc::ClientContext c;
    context(&c);
    v1::PlanResponse response;
    calls.plan = stub->Plan(&c, MakeRequest(params, 1, 0, {5}), &response);
  }
  {
    grpc::ClientContext c;
    context(&c);
    v1::PlanGroupRequest request;
    params.step = step + 1;
    *request.mutable_spec() = MakeRequest(params, 1, 0, {}).spec();
    request.add_ranks()->add_sequence_lengths(7);
    v1::PlanGroupResponse response;
    calls.plan_group = stub->PlanGroup(&c, request, &response);
  }
  {
    grpc::ClientContext c;
    context(&c);
    v1::GetJobRequest request;
    request.set_job_id(job);
    v1::JobState state;
    calls.get_job = stub->GetJob(&c, request, &state);
  }
  return calls;
}

void ExpectAllRefused(const Calls& calls, grpc::StatusCode code, const std::string& where) {
  for (const grpc::Status* s : {&calls.plan, &calls.plan_group, &calls.get_job}) {
    EXPECT_EQ(s->error_code(), code) << where << ": " << s->error_message();
  }
}

TEST(TokenServiceTest, AStrangerLearnsNothingAndTheJobsOwnTokenWorks) {
  const std::string path = TempPath("keys_service");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  PlannerServerOptions options = TestOptions();
  options.auth = AuthMode::kToken;
  options.auth_key_file = path;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto channel = testing_util::LocalChannel(server->port());

  const Calls own = CallAs(channel, "victim", MintJobToken(kKeyA, "victim"), 0);
  EXPECT_TRUE(own.plan.ok()) << own.plan.error_message();
  EXPECT_TRUE(own.plan_group.ok()) << own.plan_group.error_message();
  EXPECT_TRUE(own.get_job.ok()) << own.get_job.error_message();

  const std::string strangers = MintJobToken(kKeyA, "stranger");
  const Calls existing = CallAs(channel, "victim", strangers, 10);
  const Calls missing = CallAs(channel, "no-such-job", strangers, 10);
  ExpectAllRefused(existing, grpc::StatusCode::PERMISSION_DENIED, "victim's job");
  ExpectAllRefused(missing, grpc::StatusCode::PERMISSION_DENIED, "a job that does not exist");
  // The same answer whether the job exists or not.
  EXPECT_EQ(existing.get_job.error_message(), missing.get_job.error_message());
  EXPECT_EQ(existing.plan.error_message(), missing.plan.error_message());
  EXPECT_EQ(existing.plan_group.error_message(), missing.plan_group.error_message());
  ExpectAllRefused(CallAs(channel, "victim", "", 20), grpc::StatusCode::UNAUTHENTICATED,
                   "no token");
  ExpectAllRefused(CallAs(channel, "victim", MintJobToken(kKeyB, "victim"), 20),
                   grpc::StatusCode::PERMISSION_DENIED, "another planner's key");
  // Nothing the stranger sent reached the victim's job: its steps are the
  // ones its own calls made.
  EXPECT_EQ(server->service().rendezvous().jobs(), 1);
  // The stranger's own job works with its token.
  const Calls stranger_own = CallAs(channel, "stranger", strangers, 0);
  EXPECT_TRUE(stranger_own.plan.ok()) << stranger_own.plan.error_message();
  EXPECT_TRUE(stranger_own.get_job.ok()) << stranger_own.get_job.error_message();
}

TEST(MtlsServiceTest, TheCertificatesNamesDecideWhichJobsItMayActAs) {
  const std::string dir = TempPath("auth_tls");
  std::string log;
  ASSERT_TRUE(testing_util::MakeTlsFiles(
      dir,
      {{"team-a", "URI:spiffe://cluster.local/ns/team-a/sa/trainer"},
       {"job-b", "DNS:job-b"},
       {"anonymous", ""}},
      &log))
      << "openssl failed (scripts/setup.sh installs it): " << log;
  auto read = [&](const std::string& name) {
    return testing_util::ReadFile(absl::StrCat(dir, "/", name));
  };
  PlannerServerOptions options = TestOptions();
  options.tls = {dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  options.auth = AuthMode::kMtls;
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto channel_of = [&](const std::string& client) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = read("ca.pem");
    tls.pem_cert_chain = read(client + ".pem");
    tls.pem_private_key = read(client + ".key");
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::SslCredentials(tls), args);
  };
  const Calls team = CallAs(channel_of("team-a"), "team-a/run-1", "", 0);
  EXPECT_TRUE(team.plan.ok()) << team.plan.error_message();
  EXPECT_TRUE(team.plan_group.ok()) << team.plan_group.error_message();
  EXPECT_TRUE(team.get_job.ok()) << team.get_job.error_message();
  const Calls b = CallAs(channel_of("job-b"), "job-b", "", 0);
  EXPECT_TRUE(b.plan.ok()) << b.plan.error_message();
  ExpectAllRefused(CallAs(channel_of("job-b"), "team-a/run-1", "", 10),
                   grpc::StatusCode::PERMISSION_DENIED, "job-b as team-a's job");
  ExpectAllRefused(CallAs(channel_of("team-a"), "team-b/run-1", "", 10),
                   grpc::StatusCode::PERMISSION_DENIED, "team-a as team-b's job");
  ExpectAllRefused(CallAs(channel_of("anonymous"), "job-b", "", 10),
                   grpc::StatusCode::UNAUTHENTICATED, "a certificate without names");
}

// Certificates renewed in place (a Secret's new version) are used without a
// restart, by the server and by a client's credentials alike: both move from
// one CA's certificates to another's within their refresh interval.
TEST(TlsReloadTest, RenewedCertificatesAreUsedWithoutARestart) {
  const std::string first = TempPath("reload_first"), second = TempPath("reload_second");
  const std::string live = TempPath("reload_live");
  std::string log;
  ASSERT_TRUE(testing_util::MakeTlsFiles(first, {}, &log)) << log;
  ASSERT_TRUE(testing_util::MakeTlsFiles(second, {}, &log)) << log;
  namespace fs = std::filesystem;
  fs::create_directories(live);
  auto install = [&](const std::string& from) {
    for (const char* name : {"server.pem", "server.key", "ca.pem"}) {
      fs::copy_file(from + "/" + name, live + "/" + name, fs::copy_options::overwrite_existing);
    }
  };
  install(first);
  PlannerServerOptions options = TestOptions();
  options.tls = {live + "/server.pem", live + "/server.key", "", absl::Seconds(1)};
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  // The client's CA file is the live one too.
  PlannerTls tls;
  tls.ca_file = live + "/ca.pem";
  tls.refresh_interval = absl::Seconds(1);
  auto credentials = PlannerChannelCredentials(tls);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto get_job = [&](const std::shared_ptr<grpc::ChannelCredentials>& with) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server->port()), with, args));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    v1::GetJobRequest request;
    request.set_job_id("nobody");
    v1::JobState state;
    return stub->GetJob(&context, request, &state).error_code();
  };
  auto static_ca = [&](const std::string& dir) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = testing_util::ReadFile(dir + "/ca.pem");
    return grpc::SslCredentials(ssl);
  };
  EXPECT_EQ(get_job(*credentials), grpc::StatusCode::NOT_FOUND);  // answered
  EXPECT_EQ(get_job(static_ca(second)), grpc::StatusCode::UNAVAILABLE);

  install(second);
  // Within a few refresh intervals both sides use the second CA's files.
  grpc::StatusCode server_renewed = grpc::StatusCode::UNAVAILABLE;
  grpc::StatusCode client_renewed = grpc::StatusCode::UNAVAILABLE;
  for (int i = 0; i < 50; ++i) {
    server_renewed = get_job(static_ca(second));
    client_renewed = get_job(*credentials);
    if (server_renewed == grpc::StatusCode::NOT_FOUND &&
        client_renewed == grpc::StatusCode::NOT_FOUND) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(server_renewed, grpc::StatusCode::NOT_FOUND) << "the server kept its old certificate";
  EXPECT_EQ(client_renewed, grpc::StatusCode::NOT_FOUND) << "the client kept its old CA";
  EXPECT_EQ(get_job(static_ca(first)), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace knapformer
