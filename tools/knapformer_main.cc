// knapformer: the command line of the planner core.
//   knapformer plan --input FILE|- [--rank R] [--pretty] ...
//   knapformer simulate [--data D] [--world W] [--topology T[,T...]] [--steps N] ...
//   knapformer calibrate --input FILE|- --d-model D  |  --exchanges FILE|-
//   knapformer serve [--listen ADDR] [--metrics ADDR] ... (see server/serve_flags.cc)
//   knapformer token --job ID | --prefix P/ --ttl DURATION --key-file FILE
//   knapformer help [COMMAND], knapformer COMMAND --help: the usage texts
// Exit codes: 0 success, 2 bad input (one line on stderr naming the field),
// 1 internal error.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "common/args.h"
#include "common/status_macros.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/lengths_file.h"
#include "planner/plan_json.h"
#include "planner/rank_speeds.h"
#include "planner/topology.h"
#include "planner/validate.h"
#include "server/serve_flags.h"
#include "tools/calibrate.h"
#include "tools/machine_flags.h"
#include "tools/serve.h"
#include "tools/simulate.h"
#include "tools/token.h"

namespace knapformer {
namespace {

constexpr char kUsage[] =
    "usage: knapformer <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan       print the balanced plan of one step's sequence lengths, as JSON\n"
    "  simulate   balance the paper's synthetic data streams and compare topologies\n"
    "  calibrate  fit the cost model (or the links) to measured times\n"
    "  serve      run the planner as a gRPC service\n"
    "  token      print a job's token for a planner run with --auth=token\n"
    "  replay     play the plans on this device's kernels (Python: below)\n"
    "  help       print this text, or a command's usage: knapformer help COMMAND\n"
    "\n"
    "knapformer COMMAND --help (or -h) lists the command's options and their defaults.\n"
    "train-sim, the client on CPU processes, is a binary of its own (it links LibTorch):\n"
    "bash scripts/knapformer train-sim --help. replay (times one block per simulated GPU\n"
    "on this device) is Python: knapformer replay from a pip install, or\n"
    "python3 -m knapformer.replay --help.\n";

const std::vector<OptionSpec>& PlanOptions() {
  static const std::vector<OptionSpec> kOptions = {
      {"input", "FILE|-", "", "the request as JSON; - reads stdin (required)"},
      {"rank", "R", "", "print only rank R's slice: sends, recvs, compute, ulysses"},
      {"locality", "on|off", OnOff(BalancerOptions().locality),
       "move as few tokens as possible at the same max/mean"},
      {"max-tokens-per-gpu", "N", "0", "cap on the tokens of one GPU; 0 = no cap"},
      {"cost-model", "KIND", "transformer", "transformer, uniform, linear or measured"},
      {"pretty", "", "", "indent the JSON by 2 spaces (default: one line)"},
  };
  return kOptions;
}

std::string PlanUsage() {
  return FormatUsage(
      "knapformer plan --input FILE|- [options]",
      "Read a plan request, {\"topology\", \"ranks\": [[lengths]...], \"d_model\", \"gamma\",\n"
      "\"token_bytes\", \"machine\", \"measured_attention\", \"rank_speeds\"}, and print the\n"
      "plan as JSON:\n"
      "chunks, workloads before and after, balance figures, moved tokens (docs/cli.md).",
      PlanOptions());
}

std::vector<OptionSpec> SimulateOptionSpecs() {
  const SimulateOptions defaults;
  std::vector<OptionSpec> options = {
      {"data", "D", defaults.data, "a scenario, data codes or a masked stream (above)"},
      {"lengths", "FILE", "", "your own data: one sample per line, tokens[,mask]"},
      {"samples-per-gpu", "N", "", "with --lengths: your loader's samples per GPU"},
      {"tokens-per-gpu", "T", "", "with --lengths: or its token budget per GPU"},
      {"shuffle", "on|off", OnOff(defaults.shuffle), "with --lengths: shuffle each epoch"},
      {"world", "N", absl::StrCat(defaults.world), "GPUs"},
      {"topology", "T[,T...]", "g1nN..g8nN/8,auto",
       "fixed or auto[:max_bag=G][:group=T]"},
      {"steps", "N", absl::StrCat(defaults.steps), "batches per topology"},
      {"seed", "S", absl::StrCat(defaults.seed), "the data stream's seed"},
      {"d-model", "D", absl::StrCat(defaults.d_model), "the model width (cost model)"},
      {"gamma", "G", absl::StrFormat("%g", defaults.gamma), "the cost model's attention weight"},
      {"greedy", "RULE", GreedyRuleName(defaults.greedy),
       "earliest-finish or least-occupied (the paper's)"},
      {"refine-rounds", "N", absl::StrCat(defaults.refine_rounds),
       "local refinement rounds (the paper's greedy: docs/cli.md)"},
      {"locality", "on|off", OnOff(defaults.locality),
       "move as few tokens as possible at the same max/mean"},
      {"cost-model", "KIND", "transformer", "transformer, uniform, linear or measured"},
      {"cost-table", "FILE", "", "with --cost-model measured: calibrate --table's output"},
      {"max-tokens-per-gpu", "N", "0", "cap on the tokens of one GPU; 0 = no cap"},
      {"token-bytes", "B", "2 x d-model", "bytes a routed token occupies"},
      {"rank-speeds", "SPEEDS", "",
       "plan by time: every rank's speed (S,S,...) or a few (R:S,...)"},
  };
  for (OptionSpec& option : MachineFlagOptions(defaults.machine)) {
    options.push_back(std::move(option));
  }
  return options;
}

std::string SimulateUsage() {
  return FormatUsage(
      "knapformer simulate [options]",
      "Balance the paper's synthetic data streams on each topology and print WIR before\n"
      "and after, max/mean, its lower bound, the tokens and bytes moved per step, the\n"
      "planning time and each topology's predicted step time on the machine described by\n"
      "the machine flags (docs/cli.md). --data takes data codes g{G}b{B}i{R}f{F}s{S},...\n"
      "too, and phases of a stream that changes over the steps joined by ';'. Scenarios:\n"
      "low-res, mixed-res, joint, curriculum. Masked streams, alone: video-blockcausal,\n"
      "interleaved, llm-packed; they compare the true max/mean of plans made by token\n"
      "counts, mask-blind and with the masks (docs/planner.md). --lengths FILE takes your\n"
      "own data instead: a sample's token count per line, and its mask after a comma\n"
      "(full, causal, window=W, spans=n:f;n:c;...), dealt to the GPUs as a shuffling\n"
      "distributed sampler does and batched as your loader does. The last line advises\n"
      "a topology.",
      SimulateOptionSpecs());
}

// The usage of `command`, or "" for none.
std::string UsageOf(const std::string& command) {
  if (command == "plan") return PlanUsage();
  if (command == "simulate") return SimulateUsage();
  if (command == "calibrate") return CalibrateUsage();
  if (command == "serve") return ServeUsage();
  if (command == "token") return TokenUsage();
  return "";
}

// One line naming the command, so that an error in a script's output says
// which call made it.
int FailIn(absl::string_view command, const absl::Status& status) {
  std::cerr << "knapformer " << command << ": " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kResourceExhausted
             ? 2
             : 1;
}

// The text of `path` ("-": standard input), the input of option `flag`.
absl::StatusOr<std::string> ReadInput(const std::string& path, const std::string& flag) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), {});
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  return std::string(std::istreambuf_iterator<char>(file), {});
}

int RunPlan(const std::vector<std::string>& argv) {
  auto Fail = [](const absl::Status& status) { return FailIn("plan", status); };
  if (Args::WantsHelp(argv)) {
    std::cout << PlanUsage();
    return 0;
  }
  auto args = Args::ParseOptions(argv, PlanOptions());
  if (!args.ok()) return Fail(args.status());
  auto locality = args->GetOnOff("locality", BalancerOptions().locality);
  if (!locality.ok()) return Fail(locality.status());
  BalancerOptions balancer;
  balancer.locality = *locality;
  auto cap = args->GetInt("max-tokens-per-gpu", 0, 0, INT64_MAX);
  if (!cap.ok()) return Fail(cap.status());
  balancer.max_tokens_per_gpu = *cap;
  if (!args->Has("input")) {
    return Fail(absl::InvalidArgumentError("--input: required (a file or -)"));
  }
  auto kind = ParseCostKind(args->GetString("cost-model", "transformer"), "--cost-model");
  if (!kind.ok()) return Fail(kind.status());
  std::optional<int64_t> rank;
  if (args->Has("rank")) {
    auto parsed = args->GetInt("rank", 0, 0, INT32_MAX);
    if (!parsed.ok()) return Fail(parsed.status());
    rank = *parsed;
  }
  auto text = ReadInput(args->GetString("input", "-"), "--input");
  if (!text.ok()) return Fail(text.status());
  auto json = PlanRequestToJson(*text, *kind, balancer, rank);
  if (!json.ok()) {
    // The world size is only known from the request: name the flag.
    if (absl::StartsWith(json.status().message(), "rank: ")) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", json.status().message())));
    }
    return Fail(json.status());
  }
  if (args->Has("pretty")) {
    // Parsed again rather than built twice: the plan's own serializer
    // (plan_json.cc) stays the one place that decides the fields.
    std::cout << nlohmann::json::parse(*json).dump(2) << "\n";
  } else {
    std::cout << *json;
  }
  return 0;
}

// --lengths and how the loader batches it, into `options`; with no
// --lengths, its companions are refused.
absl::Status ReadLengthsOptions(const Args& args, SimulateOptions* options) {
  if (!args.Has("lengths")) {
    for (const char* flag : {"samples-per-gpu", "tokens-per-gpu", "shuffle"}) {
      if (args.Has(flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, ": only with --lengths FILE (your own data)"));
      }
    }
    return absl::OkStatus();
  }
  if (args.Has("data")) {
    return absl::InvalidArgumentError(
        "--data and --lengths: give one (a synthetic stream, or your own data)");
  }
  const std::string path = args.GetString("lengths", "");
  KF_ASSIGN_OR_RETURN(const std::string text, ReadInput(path, "--lengths"));
  absl::StatusOr<LengthsFile> file = ParseLengthsFile(text, path);
  if (!file.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--lengths: ", file.status().message()));
  }
  if (args.Has("samples-per-gpu") == args.Has("tokens-per-gpu")) {
    return absl::InvalidArgumentError(
        "--lengths: give --samples-per-gpu N or --tokens-per-gpu T (how your loader fills "
        "one GPU's batch)");
  }
  KF_ASSIGN_OR_RETURN(options->batching.samples_per_gpu,
                      args.GetInt("samples-per-gpu", 0, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(options->batching.tokens_per_gpu,
                      args.GetInt("tokens-per-gpu", 0, 1, LengthsFile::kMaxTokens));
  KF_ASSIGN_OR_RETURN(options->shuffle, args.GetOnOff("shuffle", options->shuffle));
  options->data = path;
  options->lengths = *std::move(file);
  return absl::OkStatus();
}

// --cost-table FILE, the measured model's table, into `options` (its d_model
// too, which --d-model may only repeat); only with --cost-model measured.
absl::Status ReadCostTable(const Args& args, SimulateOptions* options) {
  const bool measured = options->cost_model == CostKind::kMeasured;
  if (!args.Has("cost-table")) {
    if (!measured) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--cost-model measured: needs --cost-table FILE (knapformer calibrate --table writes it)");
  }
  if (!measured) {
    return absl::InvalidArgumentError(
        "--cost-table: only with --cost-model measured (the table is that model's)");
  }
  const std::string path = args.GetString("cost-table", "");
  KF_ASSIGN_OR_RETURN(const std::string text, ReadInput(path, "--cost-table"));
  absl::StatusOr<CostTable> table = ParseCostTable(text, path);
  if (!table.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--cost-table: ", table.status().message()));
  }
  if (args.Has("d-model") && options->d_model != table->d_model) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--d-model: ", options->d_model, ", but --cost-table ", path, " was measured at d_model ",
        table->d_model));
  }
  options->d_model = table->d_model;
  options->measured_attention = std::move(table->attention);
  options->cost_table_path = path;
  return absl::OkStatus();
}

int RunSimulate(const std::vector<std::string>& argv) {
  auto Fail = [](const absl::Status& status) { return FailIn("simulate", status); };
  if (Args::WantsHelp(argv)) {
    std::cout << SimulateUsage();
    return 0;
  }
  auto args = Args::ParseOptions(argv, SimulateOptionSpecs());
  if (!args.ok()) return Fail(args.status());
  SimulateOptions options;
  auto machine = ParseMachineFlags(*args);
  if (!machine.ok()) return Fail(machine.status());
  options.machine = *machine;
  auto locality = args->GetOnOff("locality", BalancerOptions().locality);
  if (!locality.ok()) return Fail(locality.status());
  options.locality = *locality;
  auto kind = ParseCostKind(args->GetString("cost-model", "transformer"), "--cost-model");
  if (!kind.ok()) return Fail(kind.status());
  options.cost_model = *kind;
  options.data = args->GetString("data", options.data);
  if (absl::Status read = ReadLengthsOptions(*args, &options); !read.ok()) return Fail(read);
  auto world = args->GetInt("world", options.world, 1, 1 << 20);
  if (!world.ok()) return Fail(world.status());
  options.world = *world;
  if (args->Has("rank-speeds")) {
    auto speeds = ParseRankSpeeds(args->GetString("rank-speeds", ""), options.world,
                                  "--rank-speeds");
    if (!speeds.ok()) return Fail(speeds.status());
    options.rank_speeds = *std::move(speeds);
  }
  if (args->Has("topology")) {
    options.topologies = absl::StrSplit(args->GetString("topology", ""), ',');
  }
  auto steps = args->GetInt("steps", options.steps, 1, 1000000);
  if (!steps.ok()) return Fail(steps.status());
  options.steps = *steps;
  auto seed = args->GetInt("seed", 0, 0, INT64_MAX);
  if (!seed.ok()) return Fail(seed.status());
  options.seed = static_cast<uint64_t>(*seed);
  auto d_model = args->GetInt("d-model", options.d_model, 1, CostModel::kMaxDModel);
  if (!d_model.ok()) return Fail(d_model.status());
  options.d_model = *d_model;
  auto gamma = args->GetDouble("gamma", options.gamma);
  if (!gamma.ok()) return Fail(gamma.status());
  options.gamma = *gamma;
  if (absl::Status read = ReadCostTable(*args, &options); !read.ok()) return Fail(read);
  auto greedy = ParseGreedyRule(args->GetString("greedy", GreedyRuleName(options.greedy)),
                                "--greedy");
  if (!greedy.ok()) return Fail(greedy.status());
  options.greedy = *greedy;
  auto rounds = args->GetInt("refine-rounds", options.refine_rounds, 0, 1 << 24);
  if (!rounds.ok()) return Fail(rounds.status());
  options.refine_rounds = static_cast<int32_t>(*rounds);
  auto cap = args->GetInt("max-tokens-per-gpu", 0, 0, INT64_MAX);
  if (!cap.ok()) return Fail(cap.status());
  options.max_tokens_per_gpu = *cap;
  if (args->Has("token-bytes")) {
    auto token_bytes = args->GetInt("token-bytes", 0, 0, PlanRequest::kMaxTokenBytes);
    if (!token_bytes.ok()) return Fail(token_bytes.status());
    options.token_bytes = *token_bytes;
  }

  auto results = Simulate(options);
  if (!results.ok()) return Fail(results.status());
  std::cout << FormatSimulation(options, *results);
  return 0;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << knapformer::kUsage;
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "help" || command == "--help" || command == "-h") {
    if (args.empty()) {
      std::cout << knapformer::kUsage;
      return 0;
    }
    const std::string usage = knapformer::UsageOf(args[0]);
    if (!usage.empty() && args.size() == 1) {
      std::cout << usage;
      return 0;
    }
    if (args[0] == "train-sim") {
      std::cout << "train-sim is a binary of its own (it links LibTorch): "
                   "bash scripts/knapformer train-sim --help\n";
      return 0;
    }
    std::cerr << "knapformer help: " << (usage.empty() ? "unknown command '" : "one command, not '")
              << absl::StrJoin(args, " ") << "' (plan, simulate, calibrate, serve, token)\n";
    return 2;
  }
  if (command == "plan") return knapformer::RunPlan(args);
  if (command == "simulate") return knapformer::RunSimulate(args);
  if (command == "serve") return knapformer::RunServe(args);
  if (command == "calibrate") return knapformer::RunCalibrate(args);
  if (command == "token") return knapformer::RunToken(args);
  if (command == "replay") {  // the pip install's console script runs it
    std::cerr << "knapformer replay is Python (it times torch): python3 -m knapformer.replay, "
                 "or knapformer replay from a pip install\n";
    return 2;
  }
  std::string hint;
  const std::vector<std::string> close =
      knapformer::SuggestOptions(command, {"plan", "simulate", "calibrate", "serve", "token", "help"});
  if (!close.empty()) hint = absl::StrCat("; did you mean ", absl::StrJoin(close, " or "), "?");
  std::cerr << "knapformer: unknown command '" << command
            << "' (plan, simulate, calibrate, serve, token, help" << hint << ")\n";
  return 2;
}
