// Who may act as which job, and for which tenant (server/job_auth.h,
// server/job_token.h): the token's format and MAC domains, key files
// (errors, rotation, rereading by content, failing closed), expiry and
// revocation, the mTLS naming rules, and a served planner that refuses a
// stranger's Plan, PlanGroup and GetJob alike whether the job exists or not,
// while the job's own credential works.
#include "server/job_auth.h"

#include <filesystem>
#include <fstream>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/planner_credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/job_token.h"
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
constexpr char kKeyC[] = "00112233445566778899aabbccddeeff-key-c";  // kKeyA's length
constexpr char kTokenId[] = "0123456789abcdef";

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

const absl::Time kNow = absl::FromUnixSeconds(1800000000);

std::string JobToken(const std::string& key, const std::string& job,
                     absl::Time expires = kNow + absl::Hours(1),
                     const std::string& id = kTokenId) {
  return MintToken(key, TokenKind::kJob, job, expires, id);
}

std::string PrefixToken(const std::string& key, const std::string& prefix) {
  return MintToken(key, TokenKind::kPrefix, prefix, kNow + absl::Hours(1), kTokenId);
}

// HMAC-SHA256 in hex, computed here as the format (job_token.h) says.
std::string Hmac(const std::string& key, const std::string& message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int bytes = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &bytes);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(mac), bytes));
}

TEST(JobTokenTest, BindsItsKindScopeExpiryKeyAndIdUnderTheMac) {
  const std::string token = JobToken(kKeyA, "team-a/train.v2/7");
  const std::string key_id = Hmac(kKeyA, "knapformer key id").substr(0, 8);
  EXPECT_EQ(KeyIdOf(kKeyA), key_id);
  EXPECT_EQ(token, absl::StrCat("kf2.job.1800003600.", key_id, ".", kTokenId, ".",
                                Hmac(kKeyA, absl::StrCat("knapformer token v2\njob\n1800003600\n",
                                                         key_id, "\n", kTokenId,
                                                         "\nteam-a/train.v2/7")),
                                ".team-a/train.v2/7"));
  absl::StatusOr<knapformer::JobToken> parsed = ParseToken(token);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->kind, TokenKind::kJob);
  EXPECT_EQ(parsed->scope, "team-a/train.v2/7");  // the scope may hold dots
  EXPECT_EQ(parsed->expires, kNow + absl::Hours(1));
  EXPECT_EQ(parsed->key_id, key_id);
  EXPECT_EQ(parsed->token_id, kTokenId);
  EXPECT_TRUE(TokenMacMatches(*parsed, kKeyA));
  EXPECT_FALSE(TokenMacMatches(*parsed, kKeyB));
  // Every field is under the MAC: change any one and it no longer matches.
  knapformer::JobToken changed = *parsed;
  changed.expires += absl::Seconds(1);
  EXPECT_FALSE(TokenMacMatches(changed, kKeyA));
  changed = *parsed;
  changed.token_id = "fedcba9876543210";
  EXPECT_FALSE(TokenMacMatches(changed, kKeyA));
  changed = *parsed;
  changed.scope += "x";
  EXPECT_FALSE(TokenMacMatches(changed, kKeyA));
  // A job token is no prefix token: the kinds are separate MAC domains.
  absl::StatusOr<knapformer::JobToken> prefix = ParseToken(PrefixToken(kKeyA, "team-a/"));
  ASSERT_TRUE(prefix.ok());
  changed = *prefix;
  changed.kind = TokenKind::kJob;
  changed.scope = "team-a/x";
  EXPECT_FALSE(TokenMacMatches(changed, kKeyA));
  EXPECT_NE(NewTokenId(), NewTokenId());
  EXPECT_EQ(NewTokenId().size(), 16u);
}

TEST(JobTokenTest, WhatIsNotAVersionTwoTokenIsRefusedNamingWhy) {
  const std::string good = JobToken(kKeyA, "job");
  const struct {
    std::string token;
    const char* why;
  } cases[] = {
      {"kf1.5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
       "a kf1 token, which this planner no longer accepts"},
      {"kf2.job.1.abc", "no kf2. fields"},
      {"kf2.team.1800003600.01234567.0123456789abcdef." + std::string(64, 'a') + ".job",
       "its kind is neither job nor prefix"},
      {"kf2.job.-5.01234567.0123456789abcdef." + std::string(64, 'a') + ".job",
       "its expiry is not Unix seconds"},
      {"kf2.job.1800003600.0123456.0123456789abcdef." + std::string(64, 'a') + ".job",
       "its key id is not 8 hex digits"},
      {"kf2.job.1800003600.01234567.0123456789ABCDEF." + std::string(64, 'a') + ".job",
       "its id is not 16 hex digits"},
      {"kf2.job.1800003600.01234567.0123456789abcdef." + std::string(63, 'a') + ".job",
       "its MAC is not 64 hex digits"},
      {"kf2.job.1800003600.01234567.0123456789abcdef." + std::string(64, 'a') + ".ns/",
       "a prefix scope ends in '/', and only a prefix scope does"},
      {"kf2.prefix.1800003600.01234567.0123456789abcdef." + std::string(64, 'a') + ".ns",
       "a prefix scope ends in '/', and only a prefix scope does"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<knapformer::JobToken> parsed = ParseToken(c.token);
    ASSERT_FALSE(parsed.ok()) << c.token;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.why)) << c.token;
  }
  EXPECT_TRUE(ParseToken(good).ok());
}

TEST(JobKeysTest, BadKeyFilesNameTheFileAndLine) {
  const std::string path = TempPath("keys_bad");
  WriteFile(path, absl::StrCat("# comment\n\n", kKeyA, "\nshort\n"));
  absl::StatusOr<std::vector<JobKey>> keys = ReadJobKeys(path);
  ASSERT_FALSE(keys.ok());
  EXPECT_THAT(keys.status().message(), HasSubstr(path + ", line 4: a key of 5 characters"));
  WriteFile(path, "# only a comment\n");
  EXPECT_THAT(ReadJobKeys(path).status().message(), HasSubstr("no key"));
  EXPECT_EQ(ReadJobKeys(TempPath("keys_missing")).status().code(), absl::StatusCode::kNotFound);
  // Whole lines only: a last line without its newline is still being written.
  WriteFile(path, kKeyA);
  EXPECT_THAT(ReadJobKeys(path).status().message(),
              HasSubstr("its last line has no newline and is not read"));
  WriteFile(path, absl::StrCat("  ", kKeyA, "  \n", kKeyB, "\n", kKeyC));
  keys = ReadJobKeys(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].secret, kKeyA);
  EXPECT_EQ((*keys)[0].id, KeyIdOf(kKeyA));
  EXPECT_EQ((*keys)[1].secret, kKeyB);
}

AuthOptions TokenOptions(const std::string& key_file, const std::string& revoked_file = "") {
  AuthOptions options;
  options.mode = AuthMode::kToken;
  options.key_file = key_file;
  options.revoked_file = revoked_file;
  options.file_look_interval = absl::ZeroDuration();  // every call looks
  return options;
}

TEST(JobAuthorizerTest, ModesRefuseWhatTheyLack) {
  AuthOptions options;
  options.mode = AuthMode::kToken;
  EXPECT_THAT(JobAuthorizer::Create(options, false).status().message(),
              HasSubstr("--auth=token needs --auth-key-file"));
  options.mode = AuthMode::kMtls;
  EXPECT_THAT(JobAuthorizer::Create(options, false).status().message(),
              HasSubstr("--auth=mtls needs --tls-cert, --tls-key and --tls-client-ca"));
  EXPECT_THAT(JobAuthorizer::Create(options, true).status().message(),
              HasSubstr("--auth=mtls needs --mtls-trust-domain DOMAIN"));
  options.mtls_trust_domain = "Cluster.Local";
  EXPECT_THAT(JobAuthorizer::Create(options, true).status().message(),
              HasSubstr("'Cluster.Local' is not a SPIFFE trust domain"));
  options = AuthOptions();
  options.key_file = "/k";
  EXPECT_THAT(JobAuthorizer::Create(options, false).status().message(),
              HasSubstr("--auth-key-file is for --auth=token, not --auth=none"));
  options = TokenOptions("/k");
  options.mtls_job_names = true;
  EXPECT_THAT(JobAuthorizer::Create(options, false).status().message(),
              HasSubstr("--mtls-job-names is for --auth=mtls, not --auth=token"));
  EXPECT_THAT(JobAuthorizer::Create(TokenOptions(TempPath("keys_none")), false).status().message(),
              HasSubstr("--auth-key-file: key file"));
  EXPECT_THAT(ParseAuthMode("tokens").status().message(),
              HasSubstr("'tokens' is not one of none, token, mtls"));
}

TEST(JobAuthorizerTest, ATokenActsForItsJobUntilItExpiresOrIsRevoked) {
  const std::string keys = TempPath("keys_job"), revoked = TempPath("revoked_job");
  WriteFile(keys, absl::StrCat(kKeyA, "\n"));
  WriteFile(revoked, "# revoked token ids\n");
  auto authorizer = JobAuthorizer::Create(TokenOptions(keys, revoked), false);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  absl::StatusOr<std::string> tenant = auth.Authorize(Bearer(JobToken(kKeyA, "job-a")), "job-a",
                                                      kNow);
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(*tenant, "job-a");
  absl::Status refused =
      auth.Authorize(Bearer(JobToken(kKeyA, "job-b")), "job-a", kNow).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(),
              HasSubstr("the token is for job 'job-b', not for job 'job-a' that the request "
                        "names"));
  EXPECT_EQ(auth.Authorize(CallerCredentials(), "job-a", kNow).status().code(),
            absl::StatusCode::kUnauthenticated);
  CallerCredentials basic;
  basic.has_authorization = true;
  EXPECT_EQ(auth.Authorize(basic, "job-a", kNow).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Expired, at and after its expiry.
  const std::string short_lived = JobToken(kKeyA, "job-a", kNow + absl::Seconds(10));
  EXPECT_TRUE(auth.Authorize(Bearer(short_lived), "job-a", kNow + absl::Seconds(9)).ok());
  refused = auth.Authorize(Bearer(short_lived), "job-a", kNow + absl::Seconds(10)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.message(), HasSubstr("the token expired at 2027-01-15T08:00:10Z"));
  // Another planner's key, and a MAC that does not match.
  refused = auth.Authorize(Bearer(JobToken(kKeyB, "job-a")), "job-a", kNow).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("minted under key ", KeyIdOf(kKeyB),
                                                        ", which is not one of this planner's")));
  std::string altered = JobToken(kKeyA, "job-a");
  altered[altered.size() - 7] ^= 1;  // a digit of the MAC
  EXPECT_THAT(auth.Authorize(Bearer(altered), "job-a", kNow).status().message(),
              HasSubstr("the token's MAC does not match"));
  // Revoked by id, one token at a time: others under the same key still act.
  WriteFile(revoked, absl::StrCat("# revoked\n", kTokenId, "\n"));
  refused = auth.Authorize(Bearer(JobToken(kKeyA, "job-a")), "job-a", kNow).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("the token ", kTokenId, " is revoked")));
  EXPECT_TRUE(auth.Authorize(Bearer(JobToken(kKeyA, "job-a", kNow + absl::Hours(1),
                                             "00000000000000aa")),
                             "job-a", kNow)
                  .ok());
  EXPECT_EQ(auth.Refresh()->revoked_tokens, 1);
  // A malformed revocation list, or none where one was, refuses every token.
  WriteFile(revoked, "not-an-id\n");
  EXPECT_EQ(auth.Authorize(Bearer(JobToken(kKeyA, "job-a", kNow + absl::Hours(1),
                                           "00000000000000aa")),
                           "job-a", kNow)
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  std::filesystem::remove(revoked);
  EXPECT_EQ(auth.Refresh()->keys, 0);
}

TEST(JobAuthorizerTest, TheKeyFileIsFollowedByContentAndFailsClosed) {
  const std::string path = TempPath("keys_rotate");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  auto authorizer = JobAuthorizer::Create(TokenOptions(path), false);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  auto acts = [&](const char* key) {
    return auth.Authorize(Bearer(JobToken(key, "job-a")), "job-a", kNow).status().code();
  };
  EXPECT_EQ(acts(kKeyA), absl::StatusCode::kOk);
  EXPECT_EQ(auth.Refresh()->keys, 1);
  // Rotation: the new key first; during the overlap both keys' tokens act.
  WriteFile(path, absl::StrCat(kKeyB, "\n", kKeyA, "\n"));
  EXPECT_EQ(acts(kKeyB), absl::StatusCode::kOk);
  EXPECT_EQ(acts(kKeyA), absl::StatusCode::kOk);
  WriteFile(path, absl::StrCat(kKeyB, "\n"));
  EXPECT_EQ(acts(kKeyA), absl::StatusCode::kUnauthenticated);
  // A rewrite of the same size with the same modification time is seen.
  namespace fs = std::filesystem;
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  EXPECT_EQ(acts(kKeyA), absl::StatusCode::kOk);
  const fs::file_time_type stamp = fs::last_write_time(path);
  WriteFile(path, absl::StrCat(kKeyC, "\n"));
  fs::last_write_time(path, stamp);
  EXPECT_EQ(acts(kKeyC), absl::StatusCode::kOk);
  EXPECT_EQ(acts(kKeyA), absl::StatusCode::kUnauthenticated);
  // A line still being written is not taken; once whole, it is.
  WriteFile(path, absl::StrCat(kKeyC, "\n", kKeyB));
  EXPECT_EQ(acts(kKeyB), absl::StatusCode::kUnauthenticated);
  WriteFile(path, absl::StrCat(kKeyC, "\n", kKeyB, "\n"));
  EXPECT_EQ(acts(kKeyB), absl::StatusCode::kOk);
  // Deleted, emptied or unusable: every token is refused (fail closed),
  // said once in the log, until the file is usable again.
  ::testing::internal::CaptureStderr();
  for (const char* broken : std::initializer_list<const char*>{"", "short\n", nullptr}) {
    if (broken == nullptr) {
      fs::remove(path);
    } else {
      WriteFile(path, broken);
    }
    for (int look = 0; look < 3; ++look) {
      const absl::Status refused =
          auth.Authorize(Bearer(JobToken(kKeyC, "job-a")), "job-a", kNow).status();
      EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << (broken ? broken : "deleted");
      EXPECT_THAT(refused.message(), HasSubstr("every token is refused until that is fixed"));
    }
    EXPECT_EQ(auth.Refresh()->keys, 0);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("every token is refused"); at != std::string::npos;
       at = log.find("every token is refused", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 3u) << log;  // once per broken version
  WriteFile(path, absl::StrCat(kKeyC, "\n"));
  EXPECT_EQ(acts(kKeyC), absl::StatusCode::kOk);
  EXPECT_EQ(auth.Refresh()->keys, 1);
}

TEST(JobAuthorizerTest, APrefixTokenActsForTheJobsUnderItsPrefixOnly) {
  const std::string path = TempPath("keys_prefix");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  auto authorizer = JobAuthorizer::Create(TokenOptions(path), false);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  const std::string team = PrefixToken(kKeyA, "team-a/");
  absl::StatusOr<std::string> tenant = auth.Authorize(Bearer(team), "team-a/train/123", kNow);
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(*tenant, "team-a/");
  EXPECT_THAT(auth.Authorize(Bearer(team), "team-b/train/123", kNow).status().message(),
              HasSubstr("the token is for the jobs under 'team-a/', not for job "
                        "'team-b/train/123'"));
  EXPECT_EQ(auth.Authorize(Bearer(team), "team-a", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Stretched: a token's scope changed (a job token's, or a prefix's
  // narrowed or widened) no longer matches its MAC.
  const std::string job = JobToken(kKeyA, "team-v/victim");
  for (const std::string& stretched :
       {job + "/", job + "/1", absl::StrCat(job, ".team-v/victim/"), team + "x/",
        team.substr(0, team.size() - 2) + "/"}) {
    const absl::Status refused =
        auth.Authorize(Bearer(stretched), "team-v/victim/1", kNow).status();
    EXPECT_NE(refused.code(), absl::StatusCode::kOk) << stretched;
  }
  std::string relabelled = team;
  relabelled.replace(4, 6, "job");  // "prefix" -> "job"
  EXPECT_EQ(auth.Authorize(Bearer(relabelled + "x"), "team-a/x", kNow).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(JobAuthorizerTest, CertificatesNameJobsInTheirTrustDomainOrByNameWhereEnabled) {
  AuthOptions options;
  options.mode = AuthMode::kMtls;
  options.mtls_trust_domain = "cluster.local";
  auto authorizer = JobAuthorizer::Create(options, true);
  ASSERT_TRUE(authorizer.ok()) << authorizer.status();
  JobAuthorizer& auth = **authorizer;
  CallerCredentials caller;
  caller.certificate_names = {"job-b", "spiffe://cluster.local/ns/team-a/sa/trainer"};
  absl::StatusOr<std::string> tenant = auth.Authorize(caller, "team-a/run-1", kNow);
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(*tenant, "team-a/");
  EXPECT_EQ(auth.Authorize(caller, "team-b/run-1", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(caller, "team-a", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  // A DNS name equal to the job id names nothing unless enabled.
  EXPECT_EQ(auth.Authorize(caller, "job-b", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Another trust domain's SPIFFE id names nothing.
  CallerCredentials foreign;
  foreign.certificate_names = {"spiffe://other-domain/ns/team-a/sa/trainer"};
  EXPECT_EQ(auth.Authorize(foreign, "team-a/run-1", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(auth.Authorize(CallerCredentials(), "team-a/run-1", kNow).status().code(),
            absl::StatusCode::kUnauthenticated);

  options.mtls_trust_domain.clear();
  options.mtls_job_names = true;
  auto by_name = JobAuthorizer::Create(options, true);
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  tenant = (*by_name)->Authorize(caller, "job-b", kNow);
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(*tenant, "job-b");
  EXPECT_EQ((*by_name)->Authorize(caller, "job-bb", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Without a trust domain no SPIFFE id names a namespace.
  EXPECT_EQ((*by_name)->Authorize(caller, "team-a/run-1", kNow).status().code(),
            absl::StatusCode::kPermissionDenied);
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

// A token valid now (the served planner reads the clock).
std::string LiveToken(const std::string& key, const std::string& job,
                      absl::Duration ttl = absl::Hours(1)) {
  return MintToken(key, TokenKind::kJob, job, absl::Now() + ttl, NewTokenId());
}

TEST(TokenServiceTest, AStrangerLearnsNothingAndTheJobsOwnTokenWorks) {
  const std::string path = TempPath("keys_service"), revoked = TempPath("revoked_service");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  WriteFile(revoked, "");
  PlannerServerOptions options = TestOptions();
  options.auth = TokenOptions(path, revoked);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  auto channel = testing_util::LocalChannel(server->port());

  const Calls own = CallAs(channel, "victim", LiveToken(kKeyA, "victim"), 0);
  EXPECT_TRUE(own.plan.ok()) << own.plan.error_message();
  EXPECT_TRUE(own.plan_group.ok()) << own.plan_group.error_message();
  EXPECT_TRUE(own.get_job.ok()) << own.get_job.error_message();

  const std::string strangers = LiveToken(kKeyA, "stranger");
  const Calls existing = CallAs(channel, "victim", strangers, 10);
  const Calls missing = CallAs(channel, "no-such-job", strangers, 10);
  ExpectAllRefused(existing, grpc::StatusCode::PERMISSION_DENIED, "victim's job");
  ExpectAllRefused(missing, grpc::StatusCode::PERMISSION_DENIED, "a job that does not exist");
  // The same answer whether the job exists or not (each names the job asked for).
  EXPECT_EQ(existing.get_job.error_message(),
            absl::StrReplaceAll(missing.get_job.error_message(), {{"no-such-job", "victim"}}));
  EXPECT_EQ(existing.plan.error_message(),
            absl::StrReplaceAll(missing.plan.error_message(), {{"no-such-job", "victim"}}));
  ExpectAllRefused(CallAs(channel, "victim", "", 20), grpc::StatusCode::UNAUTHENTICATED,
                   "no token");
  ExpectAllRefused(CallAs(channel, "victim", LiveToken(kKeyB, "victim"), 20),
                   grpc::StatusCode::UNAUTHENTICATED, "another planner's key");
  ExpectAllRefused(CallAs(channel, "victim", LiveToken(kKeyA, "victim", -absl::Seconds(1)), 20),
                   grpc::StatusCode::UNAUTHENTICATED, "an expired token");
  const std::string to_revoke = LiveToken(kKeyA, "victim");
  EXPECT_TRUE(CallAs(channel, "victim", to_revoke, 30).get_job.ok());
  WriteFile(revoked, absl::StrCat(ParseToken(to_revoke)->token_id, "\n"));
  ExpectAllRefused(CallAs(channel, "victim", to_revoke, 40), grpc::StatusCode::UNAUTHENTICATED,
                   "a revoked token");
  // Stretched: the victim's own token, with the scope widened to a prefix.
  const std::string prefix_of_victim =
      absl::StrReplaceAll(LiveToken(kKeyA, "victim"), {{"kf2.job.", "kf2.prefix."}}) + "/";
  ExpectAllRefused(CallAs(channel, "victim/1", prefix_of_victim, 50),
                   grpc::StatusCode::UNAUTHENTICATED, "a job token stretched to a prefix");
  // Nothing the stranger sent reached the victim's job: its steps are the
  // ones its own calls made.
  EXPECT_EQ(server->service().rendezvous().jobs(), 1);
  // Reflection (whose requests are parsed whole before any credential is
  // looked at) is served under --auth none only.
  EXPECT_EQ(testing_util::ReflectionCode(channel), grpc::StatusCode::UNIMPLEMENTED);
  auto open_server = StartServer();
  ASSERT_NE(open_server, nullptr);
  EXPECT_NE(testing_util::ReflectionCode(testing_util::LocalChannel(open_server->port())),
            grpc::StatusCode::UNIMPLEMENTED);
  // The stranger's own job works with its token.
  const Calls stranger_own = CallAs(channel, "stranger", strangers, 0);
  EXPECT_TRUE(stranger_own.plan.ok()) << stranger_own.plan.error_message();
  EXPECT_TRUE(stranger_own.get_job.ok()) << stranger_own.get_job.error_message();
}

// A planner checking credentials never takes them in clear off this machine.
TEST(TokenServiceTest, AnAuthModeWithoutTlsServesOnlyOnLoopbackOrBehindAMesh) {
  const std::string path = TempPath("keys_transport");
  WriteFile(path, absl::StrCat(kKeyA, "\n"));
  PlannerServerOptions options = TestOptions();
  options.auth = TokenOptions(path);
  options.listen_address = "0.0.0.0:0";
  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(),
              HasSubstr("--auth=token without TLS on '0.0.0.0:0': credentials would cross the "
                        "network in clear"));
  options.mesh_tls = true;
  server = PlannerServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  options.mesh_tls = false;
  for (const char* local : {"127.0.0.1:0", "[::1]:0", "localhost:0"}) {
    options.listen_address = local;
    server = PlannerServer::Start(options);
    EXPECT_TRUE(server.ok()) << local << ": " << server.status();
  }
}

TEST(MtlsServiceTest, TheCertificatesNamesDecideWhichJobsItMayActAs) {
  const std::string dir = TempPath("auth_tls");
  std::string log;
  ASSERT_TRUE(testing_util::MakeTlsFiles(
      dir,
      {{"team-a", "URI:spiffe://cluster.local/ns/team-a/sa/trainer"},
       {"foreign", "URI:spiffe://other-domain/ns/team-a/sa/trainer"},
       {"job-b", "DNS:job-b"},
       {"anonymous", ""}},
      &log))
      << "openssl failed (scripts/setup.sh installs it): " << log;
  auto read = [&](const std::string& name) {
    return testing_util::ReadFile(absl::StrCat(dir, "/", name));
  };
  PlannerServerOptions options = TestOptions();
  options.tls = {dir + "/server.pem", dir + "/server.key", dir + "/ca.pem"};
  options.auth.mode = AuthMode::kMtls;
  options.auth.mtls_trust_domain = "cluster.local";
  options.auth.mtls_job_names = true;
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
  ExpectAllRefused(CallAs(channel_of("foreign"), "team-a/run-1", "", 10),
                   grpc::StatusCode::PERMISSION_DENIED, "another trust domain's team-a");
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
