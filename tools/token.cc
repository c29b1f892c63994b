#include "tools/token.h"

#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/args.h"
#include "server/job_auth.h"
#include "server/request_check.h"

namespace knapformer {
namespace {

const std::vector<OptionSpec>& TokenOptions() {
  static const std::vector<OptionSpec> kOptions = {
      {"job", "ID", "", "the job id the token is for, as the trainer sends it"},
      {"job-prefix", "P/", "", "or: every job id that begins with P/ (a namespace's jobs)"},
      {"key-file", "FILE", "", "the planner's --auth-key-file; its first key mints (required)"},
  };
  return kOptions;
}

}  // namespace

std::string TokenUsage() {
  return FormatUsage("knapformer token --job ID | --job-prefix P/  --key-file FILE",
                     "Print the job token that a planner run with --auth=token and this key file\n"
                     "accepts for job ID, or for every job whose id begins with P/ (the trainer's\n"
                     "KNAPFORMER_PLANNER_TOKEN, or planner_token= in Python). Anyone holding it may\n"
                     "act as those jobs: keep it in a Secret (docs/service.md#security).",
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
  const std::string prefix = args->GetString("job-prefix", "");
  const std::string key_file = args->GetString("key-file", "");
  if (job.empty() == prefix.empty()) {
    return fail(absl::InvalidArgumentError(
        "--job or --job-prefix: one of them is required (a job id, or a prefix ending in /)"));
  }
  const std::string& scope = job.empty() ? prefix : job;
  const char* flag = job.empty() ? "--job-prefix" : "--job";
  if (absl::Status valid = CheckJobId(scope); !valid.ok()) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        flag, ": '", scope, "' is not a job id the planner accepts (", valid.message(), ")")));
  }
  if (!prefix.empty() && prefix.back() != '/') {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "--job-prefix: '", prefix, "' must end in / (so that it cannot grant '", prefix,
        "x/...')")));
  }
  if (key_file.empty()) {
    return fail(absl::InvalidArgumentError("--key-file: required (the planner's key file)"));
  }
  absl::StatusOr<std::vector<std::string>> keys = ReadJobKeys(key_file);
  if (!keys.ok()) return fail(keys.status());
  std::cout << (job.empty() ? MintJobPrefixToken(keys->front(), prefix)
                            : MintJobToken(keys->front(), job))
            << "\n";
  return 0;
}

}  // namespace knapformer
