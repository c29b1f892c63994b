#include "tools/token.h"

#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "server/job_auth.h"
#include "server/job_token.h"
#include "server/request_check.h"

namespace knapformer {
namespace {

// The longest a token may live: a year, so that keys are rotated.
constexpr absl::Duration kMaxTtl = absl::Hours(24 * 366);

const std::vector<OptionSpec>& TokenOptions() {
  static const std::vector<OptionSpec> kOptions = {
      {"job", "ID", "", "the job id the token is for, as the trainer sends it"},
      {"prefix", "P/", "", "or: every job id that begins with P/ (a namespace's jobs)"},
      {"ttl", "DURATION", "", "how long it is valid: 30d, 12h, 90m (at most 366d; required)"},
      {"key-file", "FILE", "", "the planner's --auth-key-file; its first key mints (required)"},
  };
  return kOptions;
}

// "30d", or anything absl::ParseDuration takes ("12h", "90m", "1h30m").
absl::StatusOr<absl::Duration> ParseTtl(const std::string& text) {
  absl::Duration ttl;
  int64_t days = 0;
  if (absl::EndsWith(text, "d") && absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) &&
      days > 0 && days <= 366) {
    ttl = absl::Hours(24 * days);
  } else if (!absl::ParseDuration(text, &ttl)) {
    ttl = absl::ZeroDuration();
  }
  if (!(ttl > absl::ZeroDuration()) || ttl > kMaxTtl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ttl: '", text, "' is not a duration in (0, 366d] (e.g. 30d, 12h, 90m)"));
  }
  return ttl;
}

}  // namespace

std::string TokenUsage() {
  return FormatUsage(
      "knapformer token --job ID | --prefix P/  --ttl DURATION  --key-file FILE",
      "Print the token that a planner run with --auth=token and this key file accepts\n"
      "for job ID, or for every job whose id begins with P/, until DURATION from now\n"
      "(the trainer's KNAPFORMER_PLANNER_TOKEN, or planner_token= in Python). Its id and\n"
      "expiry go to stderr: add the id to the planner's --auth-revoked-file to revoke it.\n"
      "Anyone holding it may act as those jobs: keep it in a Secret\n"
      "(docs/service.md#security).",
      TokenOptions());
}

int RunToken(const std::vector<std::string>& argv) {
  if (Args::WantsHelp(argv)) {
    std::cout << TokenUsage();
    return 0;
  }
  auto fail = [](const absl::Status& status) {
    std::cerr << "knapformer token: " << status.message() << "\n";
    return 2;
  };
  absl::StatusOr<Args> args = Args::ParseOptions(argv, TokenOptions());
  if (!args.ok()) return fail(args.status());
  const std::string job = args->GetString("job", "");
  const std::string prefix = args->GetString("prefix", "");
  const std::string ttl_text = args->GetString("ttl", "");
  const std::string key_file = args->GetString("key-file", "");
  if (job.empty() == prefix.empty()) {
    return fail(absl::InvalidArgumentError(
        "--job or --prefix: one of them is required (a job id, or a prefix ending in /)"));
  }
  const std::string& scope = job.empty() ? prefix : job;
  const char* flag = job.empty() ? "--prefix" : "--job";
  if (!prefix.empty() && prefix.back() != '/') {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--prefix: '", prefix, "' must end in / (so that it cannot grant '", prefix, "x/...')")));
  }
  // A prefix is checked as a job id with one more character after it.
  const std::string as_job = job.empty() ? prefix + "j" : job;
  if (absl::Status valid = CheckJobId(as_job); !valid.ok()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", scope, "' is not ", job.empty() ? "a prefix of job ids" : "a job id",
        " the planner accepts (", valid.message(), ")")));
  }
  if (ttl_text.empty()) {
    return fail(absl::InvalidArgumentError(
        "--ttl: required (how long the token is valid, e.g. 30d; at most 366d)"));
  }
  absl::StatusOr<absl::Duration> ttl = ParseTtl(ttl_text);
  if (!ttl.ok()) return fail(ttl.status());
  if (key_file.empty()) {
    return fail(absl::InvalidArgumentError("--key-file: required (the planner's key file)"));
  }
  absl::StatusOr<std::vector<JobKey>> keys = ReadJobKeys(key_file);
  if (!keys.ok()) return fail(keys.status());
  const absl::Time expires = absl::Now() + *ttl;
  const std::string token_id = NewTokenId();
  std::cout << MintToken(keys->front().secret, job.empty() ? TokenKind::kPrefix : TokenKind::kJob,
                         scope, expires, token_id)
            << "\n";
  std::cerr << "knapformer token: id " << token_id << ", for "
            << (job.empty() ? absl::StrCat("the jobs under '", prefix, "'")
                            : absl::StrCat("job '", job, "'"))
            << ", key " << keys->front().id << ", expires "
            << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", expires, absl::UTCTimeZone()) << "\n";
  return 0;
}

}  // namespace knapformer
