// knapformer: the command line of the planner core.
//   knapformer plan --input FILE|- [--rank R] [--locality on|off] ...
//   knapformer simulate [--data D] [--world W] [--topology T[,T...]] [--steps N]
//                       [--seed S] [--d-model D] [--gamma G] ...
//   knapformer calibrate --input FILE|- --d-model D
//   knapformer serve [--listen ADDR] [--metrics ADDR] ... (see tools/serve.cc)
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
#include "absl/strings/str_split.h"
#include "planner/balance_stats.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/topology.h"
#include "planner/validate.h"
#include "tools/args.h"
#include "tools/calibrate.h"
#include "tools/plan_json.h"
#include "tools/serve.h"
#include "tools/machine_flags.h"
#include "tools/simulate.h"

namespace knapformer {
namespace {

constexpr char kUsage[] =
    "usage: knapformer <command> [options]\n"
    "\n"
    "commands:\n"
    "  plan      --input FILE|-  [--rank R] [--locality on|off]\n"
    "            [--max-tokens-per-gpu N]   (0 = no cap)\n"
    "            [--cost-model transformer|uniform|linear]\n"
    "            Read {\"topology\", \"d_model\", \"gamma\", \"token_bytes\",\n"
    "            \"ranks\": [[lengths]...]} and print the plan as JSON (or only rank R's\n"
    "            slice).\n"
    "  simulate  [--data mixed-res|low-res|joint|curriculum|CODES[;CODES...]] [--world 32]\n"
    "            [--topology g1n32,g2n16,g4n8,g8n4,auto]   (auto[:max_bag=8][:group=T])\n"
    "            [--tflops 989.4] [--intra-node-gbps 450] [--inter-node-gbps 50]\n"
    "            [--gpus-per-node 8] [--element-bytes 2] [--blocks-per-route 28]\n"
    "            [--steps 20] [--seed 0] [--d-model 3072] [--gamma 0.49]\n"
    "            [--refine-rounds 256]   (0 = the paper's greedy, with --locality off)\n"
    "            [--cost-model transformer|uniform|linear]\n"
    "            [--locality on|off]     (on: move as few tokens as possible at the\n"
    "                                     same max/mean, within 0.05%)\n"
    "            [--max-tokens-per-gpu N]   (0 = no cap)\n"
    "            [--token-bytes B]       (bytes a routed token occupies; default\n"
    "                                     2 x d-model, a bf16 hidden state)\n"
    "            Balance the paper's synthetic data streams and print WIR before and\n"
    "            after, max/mean, the lower bound, the tokens and bytes moved per step\n"
    "            and the planning time.\n"
    "            --data takes low-res, mixed-res, joint or codes g{G}b{B}i{R}f{F}s{S},...\n";

// The usage text: the planner commands, then serve's.
void PrintUsage(std::ostream& out) { out << kUsage << kCalibrateUsage << kServeUsage; }

int Fail(const absl::Status& status) {
  std::cerr << "knapformer: " << status.message() << "\n";
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kResourceExhausted
             ? 2
             : 1;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), {});
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("--input: cannot read '", path, "'"));
  return std::string(std::istreambuf_iterator<char>(file), {});
}

int RunPlan(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"input", "rank", "locality", "max-tokens-per-gpu", "cost-model"});
  if (!args.ok()) return Fail(args.status());
  auto locality = args->GetOnOff("locality", BalancerOptions().locality);
  if (!locality.ok()) return Fail(locality.status());
  BalancerOptions balancer;
  balancer.locality = *locality;
  auto cap = args->GetInt("max-tokens-per-gpu", 0, 0, INT64_MAX);
  if (!cap.ok()) return Fail(cap.status());
  balancer.max_tokens_per_gpu = *cap;
  if (!args->Has("input")) return Fail(absl::InvalidArgumentError("--input: required (a file or -)"));
  auto kind = ParseCostKind(args->GetString("cost-model", "transformer"), "--cost-model");
  if (!kind.ok()) return Fail(kind.status());
  std::optional<int64_t> rank;
  if (args->Has("rank")) {
    auto parsed = args->GetInt("rank", 0, 0, INT32_MAX);
    if (!parsed.ok()) return Fail(parsed.status());
    rank = *parsed;
  }
  auto text = ReadInput(args->GetString("input", "-"));
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
  std::cout << *json;
  return 0;
}

int RunSimulate(const std::vector<std::string>& argv) {
  std::vector<std::string> flags = {"data", "world", "topology", "steps", "seed", "d-model",
                                    "gamma", "refine-rounds", "locality", "cost-model",
                                    "max-tokens-per-gpu", "token-bytes"};
  flags.insert(flags.end(), MachineFlagNames().begin(), MachineFlagNames().end());
  auto args = Args::Parse(argv, flags);
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
  auto world = args->GetInt("world", options.world, 1, 1 << 20);
  if (!world.ok()) return Fail(world.status());
  options.world = *world;
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
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    knapformer::PrintUsage(std::cout);
    return args.empty() ? 2 : 0;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "plan") return knapformer::RunPlan(args);
  if (command == "simulate") return knapformer::RunSimulate(args);
  if (command == "serve") return knapformer::RunServe(args);
  if (command == "calibrate") return knapformer::RunCalibrate(args);
  std::cerr << "knapformer: unknown command '" << command << "' (plan, simulate, calibrate, serve, help)\n";
  return 2;
}
